"""Compiled grammars, keyed by (kind, spec, whitespace, tokenizer fingerprint), compiled
in a worker pool off the scheduler loop. A failure is cached like a success (the future
holds the exception), so a bad grammar sent again fails at once. `started_at(fut)` is when a
worker began the compile (None while it waits in the queue): the compile time limit counts
from there, not from submission, so a grammar queued behind others is not charged their time."""

from __future__ import annotations

import collections
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Hashable, Optional


class GrammarCache:
    def __init__(self, workers: int = 2, capacity: int = 512):
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="grammar")
        self.capacity = capacity
        self.entries: collections.OrderedDict[Hashable, Future] = collections.OrderedDict()
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()
        self._started: "weakref.WeakKeyDictionary[Future, float]" = weakref.WeakKeyDictionary()

    def get(self, key: Hashable, compile_fn: Callable[[], object]) -> Future:
        with self._lock:
            fut = self.entries.get(key)
            if fut is not None:
                self.hits += 1
                self.entries.move_to_end(key)
                return fut
            self.misses += 1
            box: list = []
            fut = self.pool.submit(self._timed, compile_fn, box)
            box.append(fut)
            self.entries[key] = fut
            self._evict()
            return fut

    def peek(self, key: Hashable, touch: bool = False) -> Optional[Future]:
        """The compile of `key` if one was started (and not evicted), without starting one;
        `touch`: count it as used (last to be evicted), as get() does."""
        with self._lock:
            fut = self.entries.get(key)
            if fut is not None and touch:
                self.entries.move_to_end(key)
            return fut

    def futures(self) -> list[Future]:
        """The compiles kept, as one snapshot (their worker threads may discard entries meanwhile)."""
        with self._lock:
            return list(self.entries.values())

    def discard(self, key: Hashable) -> None:
        with self._lock:
            self.entries.pop(key, None)

    def _timed(self, compile_fn: Callable[[], object], box: list) -> object:
        with self._lock:  # held by get() until the future is in the box
            self._started[box[0]] = time.monotonic()
        return compile_fn()

    def started_at(self, fut: Future) -> Optional[float]:
        """When a worker began `fut`'s compile (time.monotonic()); None while it is queued."""
        return self._started.get(fut)

    def _evict(self) -> None:
        done = [k for k, f in self.entries.items() if f.done()]
        for k in done[: max(0, len(self.entries) - self.capacity)]:
            del self.entries[k]

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def clear(self) -> None:
        with self._lock:
            self.entries.clear()
