"""llguidance's thread pool for a step's batched mask fills and accepts (`--grammar-threads`),
and how many independently built matchers ("builds") a grammar may have for those threads.

A request's matcher is a deep copy of one of its grammar's builds. Deep copies of one build
share its lexer behind one lock, held for a whole mask, so rows that copy the same build get
their masks one after another whatever the pool size; rows that copy different builds do not
wait on each other. A grammar may therefore have one build per pool thread, but no more builds
than CPUs (more could not run at once).
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

from llguidance import LLExecutor

from radixflow.constrained.options import MAX_GRAMMAR_THREADS

X = TypeVar("X")  # what rides with each matcher: its bitmask row, or its sampled token

_EXECUTORS: list = []
_THREADS = [0]  # --grammar-threads; 0: llguidance's default


def cpus() -> int:
    """The CPUs this process may run on (what llguidance's default counts)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_threads() -> int:
    """llguidance's own default pool size: 80% of the CPUs, at least 1, at most 32."""
    return min(max(cpus() * 80 // 100, 1), 32)


def pool_threads() -> int:
    """The pool's thread count: --grammar-threads if set, else llguidance's default."""
    return _THREADS[0] or default_threads()


def max_builds() -> int:
    """The most independently built matchers one grammar gets: one per pool thread, at most one per CPU."""
    return min(pool_threads(), cpus())


def set_threads(n: int) -> None:
    """Size llguidance's pool (0: its default); the pool is rebuilt on its next use if the size changed."""
    assert 0 <= n <= MAX_GRAMMAR_THREADS, n  # ServerArgs refuses others
    if n != _THREADS[0]:
        _THREADS[0] = n
        _EXECUTORS.clear()


def executor() -> LLExecutor:
    """llguidance's thread pool for batched mask fills and accepts (one per process, built on first use)."""
    if not _EXECUTORS:
        _EXECUTORS.append(LLExecutor(num_threads=pool_threads()))
    return _EXECUTORS[0]


def by_build(pairs: list[tuple[Any, X]]) -> list[tuple[Any, X]]:
    """(matcher, x) pairs with the rows of each build next to each other (a matcher's `root_id`
    is its build's id). llguidance's pool splits a batched call's list into contiguous runs, one
    per thread; rows that copy one build wait on its lexer's lock, so runs that mix builds
    (requests take the builds in turn) keep every thread waiting on the others' locks."""
    return sorted(pairs, key=lambda p: p[0].root_id)
