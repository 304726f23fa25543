"""Tokenizes a request graph's constant text pieces ahead of its run, on the caller's thread.

The executor tokenizes each text piece (segment_tokens has the boundary rule) when the
strand reaches the next model call, inside the scheduler's turn: a few-shot prompt's
thousands of tokens, for every program of a batch, on the thread that launches the forward
passes. An eager program tokenizes on its own thread instead, while a pass runs. So the
Engine (and the server's main process) encode here every piece known before the run: text
made only of constants (no variable), and every select's choices. The executor looks each
piece up by (text, first) and encodes only what is missing (pieces holding variable values).
"""

from __future__ import annotations

from radixflow.runtime.programs.program_ops import Op
from radixflow.runtime.programs.segment_tokens import encode_piece

Pieces = dict  # (text, first) -> token ids


def constant_pieces(tokenizer, ops: list[Op]) -> Pieces:
    pieces: Pieces = {}
    _strand(tokenizer, ops, True, pieces)
    return pieces


def _strand(tokenizer, ops: list[Op], first: bool, pieces: Pieces) -> None:
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
            pieces[(text, first)] = encode_piece(tokenizer, text, first)
        empty = first and not text  # no tokens yet: a branch's first piece is the program's first
        if op.kind == "select":
            for c in op.choices:
                pieces.setdefault((c, False), encode_piece(tokenizer, c, first=False))
        elif op.kind == "fork":
            for branch in op.branches:
                _strand(tokenizer, branch, empty, pieces)
        first = empty and op.kind == "fork"
        text, constant = "", True
    if text and constant:
        pieces[(text, first)] = encode_piece(tokenizer, text, first)
