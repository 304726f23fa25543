"""Tokenizes a request graph's constant text pieces ahead of its run, on the caller's thread.

The executor tokenizes each text piece (segment_tokens has the boundary rule) when the
strand reaches the next model call, inside the scheduler's turn: a few-shot prompt's
thousands of tokens, for every program of a batch, on the thread that launches the forward
passes. An eager program tokenizes on its own thread instead, while a pass runs. So the
Engine (and the server's main process) encode here every piece known before the run: text
made only of constants (no variable), and every select's choices. The executor looks each
piece up by (text, first) and encodes only what is missing (pieces holding variable values).

A program's pieces are encoded in one call of the tokenizers backend per kind (first or not),
which runs without the GIL; transformers' wrapper around it is Python that holds the GIL
(about as long again as the encoding of a short piece) while the engine thread needs it.
"""

from __future__ import annotations

import copy
import threading
import weakref
from typing import Any, Callable, Optional

from radixflow.runtime.programs.program_ops import Op
from radixflow.runtime.programs.segment_tokens import encode_piece
from radixflow.runtime.scheduling.stop_checker import _defined_in

Pieces = dict  # (text, first) -> token ids
BatchEncode = Callable[[list, bool], list]  # (texts, first) -> each text's token ids

# transformers' modules whose encode hands the text to the tokenizers backend's encode_batch as it is
_STOCK_ENCODE = ("transformers.tokenization_utils_base", "transformers.tokenization_utils_tokenizers",
                 "transformers.tokenization_utils_fast")  # fmt: skip
_PROBE = "Hello world!\n\n  It's 3.14 -- naïve café, 日本語 <|endoftext|> <s></s> [CLS]\tend "
_ENCODERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_ENCODERS_LOCK = threading.Lock()


def constant_pieces(tokenizer, ops: list[Op], known: Optional[Pieces] = None) -> Pieces:
    """`known`: pieces tokenized before (a program template's), taken as they are."""
    keys: dict = {}  # (text, first) -> None, in the walk's order
    _strand(ops, True, keys)
    encode = batch_encoder(tokenizer)
    pieces: Pieces = {k: known[k] for k in keys if k in known} if known else {}
    for first in (True, False):
        texts = [text for text, f in keys if f is first and (text, f) not in pieces]
        if texts:
            pieces.update(((text, first), ids) for text, ids in zip(texts, encode(texts, first)))
    return pieces


def _strand(ops: list[Op], first: bool, keys: dict) -> None:
    """Walks one strand as the executor does: text and var ops build the pending piece; a
    gen, select, fork or concatenating join tokenizes it (a gathering join does not). A key
    this walk gets wrong is only a miss: every entry holds its own key's tokens."""
    text, constant = "", True
    for op in ops:
        if op.kind == "text":
            text += op.text
            continue
        if op.kind == "var":
            constant = False
            continue
        if op.kind == "join" and op.mode != "concat":
            continue
        if text and constant:
            keys[(text, first)] = None
        empty = first and not text  # no tokens yet: a branch's first piece is the program's first
        if op.kind == "select":
            keys.update(((c, False), None) for c in op.choices)
        elif op.kind == "fork":
            for branch in op.branches:
                _strand(branch, empty, keys)
        first = empty and op.kind == "fork"
        text, constant = "", True
    if text and constant:
        keys[(text, first)] = None


def batch_encoder(tokenizer) -> BatchEncode:
    """encode_piece over many texts: the tokenizers backend's encode_batch where that gives
    tokenizer.encode's ids (a stock fast tokenizer, checked on a probe), else encode_piece each."""
    try:
        found = _ENCODERS.get(tokenizer)  # the lock only on a miss
        if found is None:
            with _ENCODERS_LOCK:
                found = _ENCODERS.get(tokenizer)
                if found is None:
                    found = _ENCODERS[tokenizer] = _make_encoder(weakref.ref(tokenizer))
        return found
    except TypeError:  # not weakly referenceable: work it out each time
        return _make_encoder(lambda: tokenizer)


def _make_encoder(tokenizer_ref: Callable[[], Any]) -> BatchEncode:
    """The encoder reaches its tokenizer through `tokenizer_ref` (a weakref when cached): a
    strong reference in the WeakKeyDictionary's value would keep its key alive forever."""

    def each(texts: list, first: bool) -> list:
        return [encode_piece(tokenizer_ref(), t, first) for t in texts]

    backend = _plain_backend(tokenizer_ref())
    if backend is None:
        return each

    def fast(texts: list, first: bool) -> list:
        split = bool(getattr(tokenizer_ref(), "split_special_tokens", False))
        if backend.encode_special_tokens != split:  # the setter borrows the Rust side mutably: only on a change
            backend.encode_special_tokens = split
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=first)]

    same = all(fast([_PROBE, _PROBE[5:]], first) == each([_PROBE, _PROBE[5:]], first) for first in (True, False))
    return fast if same else each


def _plain_backend(tokenizer) -> Optional[object]:
    """A copy of a stock fast tokenizer's Rust side with padding and truncation off (transformers'
    encode switches them off on every call; a tokenizer.json may leave them on), else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    names = ("encode", "_encode_plus", "set_truncation_and_padding")
    if backend is None or not all(_defined_in(type(tokenizer), n) in _STOCK_ENCODE for n in names):
        return None
    backend = copy.copy(backend)
    backend.no_padding()
    backend.no_truncation()
    return backend
