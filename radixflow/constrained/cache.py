"""Compiled grammars, keyed by (kind, spec, whitespace, tokenizer fingerprint), compiled
in a worker pool off the scheduler loop. A failure is cached like a success (the future
holds the exception), so a bad grammar sent again fails at once."""

from __future__ import annotations

import collections
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Hashable


class GrammarCache:
    def __init__(self, workers: int = 2, capacity: int = 512):
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="grammar")
        self.capacity = capacity
        self.entries: collections.OrderedDict[Hashable, Future] = collections.OrderedDict()
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable, compile_fn: Callable[[], object]) -> Future:
        with self._lock:
            fut = self.entries.get(key)
            if fut is not None:
                self.hits += 1
                self.entries.move_to_end(key)
                return fut
            self.misses += 1
            fut = self.pool.submit(compile_fn)
            self.entries[key] = fut
            self._evict()
            return fut

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
