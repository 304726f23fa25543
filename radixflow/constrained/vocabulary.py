"""The token vocabulary as bytes, built once per tokenizer.

Byte-level BPE (GPT-2 style: `Ġ` = space, one printable character per byte) and
SentencePiece (`▁` = space, `<0xAB>` byte-fallback tokens) are decoded to the exact
bytes each token contributes to the text. Special tokens are left out: the FSM allows
EOS only in accepting states, and no grammar can produce the others.
"""

from __future__ import annotations

import bisect
import copy
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from outlines_core import Vocabulary

NO_BYTE = 256  # first_byte of a token that has no bytes (special or missing ids)
END_BYTE = b"\x00"  # the end marker fsm.compile_regex appends to every regex; no real token may contain it
END_TOKEN = (1 << 31) - 1  # the marker's token id in `TokenVocab.outlines`, beyond any real vocabulary
_SP_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _gpt2_byte_decoder() -> dict[str, int]:
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_DECODER = _gpt2_byte_decoder()


@dataclass
class TokenVocab:
    eos_id: int  # the EOS id outlines-core's index allows in accepting states
    eos_ids: tuple  # every EOS id of the model
    vocab_size: int  # the model's (logits width), may exceed the tokenizer's
    token_bytes: list  # id -> bytes, or None for special / missing ids
    first_byte: np.ndarray  # [vocab_size] int16, NO_BYTE where a token has no bytes
    single_byte_token: np.ndarray  # [256] int32: a token that is exactly this byte, or -1
    outlines: Vocabulary  # what outlines-core indexes: no token with a NUL byte, plus END_TOKEN (fsm.py says why)
    fingerprint: str
    kind: str  # "byte_level" or "sentencepiece"
    by_bytes: Optional[tuple] = field(default=None, repr=False)  # (token bytes sorted, their ids)
    _extensions: dict = field(default_factory=dict, repr=False)

    @property
    def words(self) -> int:
        return (self.vocab_size + 31) // 32

    def extensions(self, token: int) -> np.ndarray:
        """Ids of the tokens whose bytes start with `token`'s and are longer (cached per token;
        a bisection over the vocabulary sorted by bytes, no loop over it)."""
        out = self._extensions.get(token)
        if out is None:
            if self.by_bytes is None:
                self.by_bytes = _sorted_by_bytes(self.token_bytes)
            keys, ids = self.by_bytes
            prefix = self.token_bytes[token] if 0 <= token < self.vocab_size else None
            if prefix is None:
                out = np.zeros(0, dtype=np.int32)
            else:
                lo = bisect.bisect_right(keys, prefix)  # past the token itself (and equal-byte twins)
                hi = bisect.bisect_left(keys, prefix + b"\xff" * 64)
                out = ids[lo:hi]
            self._extensions[token] = out
        return out

    def decode_bytes(self, ids: list) -> Optional[bytes]:
        parts = [self.token_bytes[t] if 0 <= t < self.vocab_size else None for t in ids]
        return None if any(p is None for p in parts) else b"".join(parts)


def _outlines_vocabulary(eos_id: int, by_bytes: dict) -> Vocabulary:
    """The real tokens without those containing a NUL byte (grammars never emit NUL), and
    the end marker as one more token."""
    kept = {b: ids for b, ids in by_bytes.items() if END_BYTE not in b}
    kept[END_BYTE] = [END_TOKEN]
    return Vocabulary(eos_id, kept)


def _sorted_by_bytes(token_bytes: list) -> tuple:
    pairs = sorted((b, i) for i, b in enumerate(token_bytes) if b is not None)
    return [b for b, _ in pairs], np.array([i for _, i in pairs], dtype=np.int32)


def plain_rust_tokenizer(tokenizer):
    """A copy of a fast tokenizer's Rust side with padding and truncation off, or None for a
    slow tokenizer. A tokenizer.json that sets either leaves it on in the Rust side at load;
    the Python wrapper's encode switches it off on every call, a direct call would not."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    backend = copy.copy(backend)
    backend.no_padding()
    backend.no_truncation()
    return backend


def tokenizer_kind(tokenizer) -> str:
    """'byte_level' or 'sentencepiece', from the fast tokenizer's decoder, else from the vocab."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        decoder = json.dumps(json.loads(backend.to_str()).get("decoder"))
        if '"ByteLevel"' in decoder:
            return "byte_level"
        if "ByteFallback" in decoder or "Metaspace" in decoder or "\\u2581" in decoder:
            return "sentencepiece"
    pieces = list(tokenizer.get_vocab())[:5000]
    spaced = sum(p.startswith("▁") for p in pieces)
    return "sentencepiece" if spaced > sum(p.startswith("Ġ") for p in pieces) else "byte_level"


def token_to_bytes(token: str, kind: str) -> bytes:
    if kind == "sentencepiece":
        m = _SP_BYTE.fullmatch(token)
        return bytes([int(m.group(1), 16)]) if m else token.replace("▁", " ").encode("utf-8")
    if all(c in _BYTE_DECODER for c in token):
        return bytes(_BYTE_DECODER[c] for c in token)
    return token.encode("utf-8")  # an added (non-byte-mapped) token


def special_ids(tokenizer) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for i, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(tok, "special", False):
            ids.add(int(i))
    return ids


def build_token_vocab(tokenizer, vocab_size: int, eos_ids: set) -> TokenVocab:
    """Once per tokenizer (a loop over the vocabulary is fine here, never per token)."""
    kind = tokenizer_kind(tokenizer)
    skip = special_ids(tokenizer) | set(eos_ids)
    added = {int(i): t.content for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()}
    token_bytes: list = [None] * vocab_size
    for token, i in tokenizer.get_vocab().items():
        if i in skip or not 0 <= i < vocab_size:
            continue
        b = added[i].encode("utf-8") if i in added else token_to_bytes(token, kind)
        token_bytes[i] = b or None
    return _assemble(token_bytes, vocab_size, sorted(eos_ids), kind)


def _assemble(token_bytes: list, vocab_size: int, eos: list, kind: str) -> TokenVocab:
    assert eos, "a model needs an EOS id for grammars to end"
    by_bytes: dict[bytes, list] = {}
    first = np.full(vocab_size, NO_BYTE, dtype=np.int16)
    single = np.full(256, -1, dtype=np.int32)
    for i, b in enumerate(token_bytes):
        if b is None:
            continue
        by_bytes.setdefault(b, []).append(i)
        first[i] = b[0]
        if len(b) == 1 and single[b[0]] < 0:
            single[b[0]] = i
    digest = hashlib.sha1(repr((kind, vocab_size, eos)).encode())
    for b in token_bytes:
        digest.update(b"\xff" if b is None else b + b"\x00")
    return TokenVocab(
        eos_id=eos[0],
        eos_ids=tuple(eos),
        vocab_size=vocab_size,
        token_bytes=token_bytes,
        first_byte=first,
        single_byte_token=single,
        outlines=_outlines_vocabulary(eos[0], by_bytes),
        fingerprint=digest.hexdigest()[:16],
        kind=kind,
        by_bytes=_sorted_by_bytes(token_bytes),  # for jump-forward's extension check
    )
