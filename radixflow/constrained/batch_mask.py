"""One packed bitmask `[B, ceil(V/32)]` int32 for a batch's constrained rows, and one
batched accept of their sampled tokens.

Rows are grouped by matcher class and each class fills its rows in one call
(`fill_rows`): outlines-core masks are cached per FSM state, so each of its rows is
one copy of a cached mask; llguidance computes masks afresh, so its rows go to llguidance's
executor, which fills them on native threads without the GIL. Free rows stay all ones.
On CUDA the bitmask lives in pinned memory, so its copy to the GPU never waits.
Sampled tokens are accepted the same way (`accept_rows`): llguidance consumes a batch's
tokens on its threads in one call instead of one Python call per row.
"""

from __future__ import annotations

from typing import Optional

import torch


def new_bitmask(batch: int, words: int, pinned: bool, free: Optional[list[int]] = None) -> torch.Tensor:
    """Pinned for an asynchronous host-to-GPU copy (torch's host allocator reuses a block once its
    copy is done). Every token allowed in the rows `free` (None: all rows); the other rows are left
    unwritten, for `fill_bitmask_rows` to fill."""
    out = torch.empty((batch, words), dtype=torch.int32, pin_memory=pinned)
    rows = out.numpy()  # one thread: torch's fill_ wakes its thread pool, which then competes with the grammar threads
    if free is None:
        rows.fill(-1)
    elif free:
        rows[free] = -1
    return out


def fill_bitmask_rows(bitmask: torch.Tensor, rows: list) -> None:
    """`rows`: (row index, matcher) pairs; each matcher's class has `fill_rows(pairs, bitmask)`."""
    for cls, pairs in _by_class((matcher, row) for row, matcher in rows).items():
        cls.fill_rows(pairs, bitmask)


def accept_tokens(rows: list) -> None:
    """`rows`: (matcher, token) pairs; each matcher's class has `accept_rows(pairs)`."""
    for cls, pairs in _by_class(rows).items():
        cls.accept_rows(pairs)


def _by_class(pairs) -> dict:
    """(matcher, x) pairs grouped by the matcher's class, in order."""
    groups: dict = {}
    for matcher, x in pairs:
        groups.setdefault(type(matcher), []).append((matcher, x))
    return groups
