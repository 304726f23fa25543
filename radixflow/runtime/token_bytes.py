"""The raw bytes a token stands for, as OpenAI's logprobs report them (`bytes`), so that a character spelled in
several tokens (a CJK character, an emoji) can be rebuilt by joining them: each such token's decoded text alone
is U+FFFD, whose UTF-8 says nothing.

    bytes_of = TokenBytes(tokenizer)
    bytes_of(token_id)   # b'\\xe7' for a byte-level BPE token 'ç', b'\\xe6' for '<0xE6>'

A byte-level BPE vocabulary (GPT-2, Llama 3, Qwen, SmolLM) writes each byte as one character of GPT-2's table;
a SentencePiece vocabulary with byte fallback writes a lone byte as `<0xHH>` and a space as `▁`. Special tokens
and any other vocabulary give the UTF-8 of the token's text.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Optional

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def _gpt2_chars() -> dict:
    """GPT-2's byte-to-character table, inverted: the character a byte-level vocabulary writes -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class TokenBytes:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.byte_level = _decoder_type(tokenizer) == "ByteLevel"
        self.special = set(getattr(tokenizer, "all_special_ids", []) or [])
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
        lone = _BYTE_TOKEN.fullmatch(piece)
        if lone:
            return bytes([int(lone.group(1), 16)])
        if self.byte_level:
            table = _gpt2_chars()
            if all(c in table for c in piece):
                return bytes(table[c] for c in piece)
        return piece.replace("▁", " ").encode("utf-8")


def _decoder_type(tokenizer) -> Optional[str]:
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return None
    try:
        return json.loads(decoder.__getstate__())["type"]
    except (AttributeError, TypeError, ValueError, KeyError):
        return type(decoder).__name__
