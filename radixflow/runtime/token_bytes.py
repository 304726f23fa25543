"""The raw bytes a token stands for, as OpenAI's logprobs report them (`bytes`), so that a character spelled in
several tokens (a CJK character, an emoji) can be rebuilt by joining them: each such token's decoded text alone
is U+FFFD, whose UTF-8 says nothing.

    bytes_of = TokenBytes(tokenizer)
    bytes_of(token_id)   # b'\\xe7' for a byte-level BPE token 'ç', b'\\xe6' for '<0xE6>'

The vocabulary's own reading (constrained/vocabulary.py, which the outlines grammar backend builds its byte
vocabulary with): byte-level BPE writes each byte as one character of GPT-2's table, SentencePiece a lone byte as
`<0xHH>` and a space as `▁`. Special tokens give the UTF-8 of their text.
"""

from __future__ import annotations

from radixflow.constrained.vocabulary import special_ids, token_to_bytes, tokenizer_kind


class TokenBytes:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.kind = tokenizer_kind(tokenizer)
        self.special = special_ids(tokenizer)
        self._known: dict = {}

    def __call__(self, token_id: int) -> bytes:
        known = self._known.get(token_id)
        if known is None:
            known = self._known[token_id] = self._bytes(token_id)
        return known

    def _bytes(self, token_id: int) -> bytes:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if not isinstance(piece, str) or token_id in self.special:
            return self.tokenizer.decode([token_id]).encode("utf-8")
        return token_to_bytes(piece, self.kind)
