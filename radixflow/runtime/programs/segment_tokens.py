"""The tokenization-boundary rule of LLM programs, shared by the eager interpreter and
the in-scheduler request-graph executor so that both build the same token sequence.

A program's token sequence is a concatenation of pieces, each tokenized on its own:

* a *text piece* is all text (constants, arguments, role markers, variable values)
  between two model calls; it is tokenized once, as one string. Only the first piece
  of a program gets the tokenizer's special tokens (BOS, if the tokenizer adds one).
* a *gen piece* is the generated tokens themselves (never re-tokenized). A trailing
  EOS / stop token id is dropped, and if a stop string was trimmed from the text, the
  tokens are cut back to the longest run whose decoded text is a prefix of the kept
  text; the rest of the kept text (a part-token) is tokenized separately.
* a *select piece* is the chosen option tokenized on its own (the same ids that were scored).

So "Paris" generated followed by the text "." becomes [..., " Paris"] + ["."], even
where the tokenizer would merge the two when reading the whole string at once.
Backends without a tokenizer (OpenAI-compatible endpoints) send text and let the server
re-tokenize, so their boundaries may differ.
"""

from __future__ import annotations

from typing import Optional

from radixflow.runtime.programs.piece_codec import batch_encoder, piece_decoder


def encode_piece(tokenizer, text: str, first: bool) -> list[int]:
    """A text piece's ids: tokenizer.encode's (with special tokens only if `first`), through the
    tokenizers backend where that gives the same ids (piece_codec.batch_encoder)."""
    if not text:
        return []
    return batch_encoder(tokenizer)([text], first)[0]


def gen_piece(
    tokenizer, ids: list[int], finish_reason: Optional[dict], skip_special: bool = True, no_stop_trim: bool = False
) -> tuple[str, list[int]]:
    """(text, kept ids) of one gen segment: the text a program sees, and the token ids
    that continue the sequence (matching that text)."""
    ids = list(ids)
    matched = (finish_reason or {}).get("matched")
    if isinstance(matched, int) and ids and ids[-1] == matched and not no_stop_trim:
        ids = ids[:-1]
    text = piece_decoder(tokenizer)(ids, skip_special)
    if isinstance(matched, str) and not no_stop_trim:
        cut = text.find(matched)
        if cut >= 0:
            text = text[:cut]
            return text, _ids_for_prefix(tokenizer, ids, text, skip_special)
    return text, ids


def _ids_for_prefix(tokenizer, ids: list[int], text: str, skip_special: bool) -> list[int]:
    """The longest leading run of `ids` decoding to a prefix of `text`, plus the
    remainder of `text` tokenized on its own."""
    decode = piece_decoder(tokenizer)
    for k in range(len(ids), -1, -1):
        head = decode(ids[:k], skip_special)
        if text.startswith(head) and "\ufffd" not in head:
            return ids[:k] + encode_piece(tokenizer, text[len(head) :], first=False)
    return encode_piece(tokenizer, text, first=False)
