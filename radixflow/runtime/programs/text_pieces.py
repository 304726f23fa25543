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

from typing import Optional

from radixflow.runtime.programs.piece_codec import batch_encoder
from radixflow.runtime.programs.program_ops import Op

Pieces = dict  # (text, first) -> token ids


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
