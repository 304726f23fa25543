"""One packed bitmask `[B, ceil(V/32)]` int32 for a batch's constrained rows, and one
batched accept of their sampled tokens.

Rows are grouped by matcher class and each class fills its rows in one call
(`fill_rows`): outlines-core masks are cached per FSM state, so each of its rows is
one copy of a cached mask; llguidance computes masks afresh, so its rows go to llguidance's
executor, which fills them on native threads without the GIL. Free rows stay all ones.
On CUDA the bitmask lives in pinned memory, so its copy to the GPU never waits.
Sampled tokens are accepted the same way (`accept_rows`): llguidance consumes a batch's
tokens on its threads in one call instead of one Python call per row.

`BackgroundFill` fills llguidance rows on worker threads, one part of a batch at a time, while
the scheduler thread goes on with the rest of its step (overlap.py).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
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


MAX_PARTS = 4  # background fills under way at once in one step (the pool has this many threads)
_POOL: list = []


class BackgroundFill:
    """A bitmask whose grammar rows are filled on worker threads while the caller goes on.

    Ownership: a matcher handed to `add` belongs to the fill until `join` returns: until then
    the caller's thread must not touch it, nor its request (the fill reads the request's
    token budget). Two threads never touch one matcher (llguidance's matchers are not shared
    between threads; a second borrow would raise). Only rows whose fill releases the GIL
    (llguidance's, `masks_cached` False) are worth handing over: outlines' masks are Python
    copies, made by `fill_rest`."""

    def __init__(self, batch: int, words: int, pinned: bool):
        self.bitmask = torch.empty((batch, words), dtype=torch.int32, pin_memory=pinned)
        self.rows: set = set()  # rows handed to the fill
        self._jobs: list[Future] = []

    def add(self, rows: list) -> None:
        """(row index, matcher) pairs, filled on a worker thread. Returns once the worker has
        started (it needs the GIL only until llguidance releases it), so the fill does not wait
        for the caller's thread to give up the GIL."""
        if not rows:
            return
        assert len(self._jobs) < MAX_PARTS, "more parts than worker threads: add would wait for a fill"
        self.rows.update(row for row, _ in rows)
        started = threading.Event()
        self._jobs.append(_pool().submit(self._fill, rows, started))
        started.wait()

    def _fill(self, rows: list, started: threading.Event) -> None:
        started.set()
        with torch.inference_mode():  # thread-local: the scheduler's bitmask is an inference tensor
            fill_bitmask_rows(self.bitmask, rows)

    def join(self) -> torch.Tensor:
        """Waits for every fill (re-raising a fill's error); the matchers are the caller's again."""
        for job in self._jobs:
            job.result()
        self._jobs.clear()
        return self.bitmask

    def fill_rest(self, rows: list, free: list[int]) -> torch.Tensor:
        """After `join`: the rows of `rows` ((row index, matcher) pairs) not filled yet, here, and
        every token allowed in the rows `free`. Returns the bitmask."""
        self.join()
        out = self.bitmask.numpy()
        if free:
            out[free] = -1
        fill_bitmask_rows(self.bitmask, [(i, m) for i, m in rows if i not in self.rows])
        return self.bitmask


def _pool() -> ThreadPoolExecutor:
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(MAX_PARTS, thread_name_prefix="rf-mask"))
    return _POOL[0]
