"""One shared pool of worker threads for async APIs that wrap blocking calls (`Engine.async_generate`,
`f.run_async`): each waiting call holds a thread, so an event loop can have many in flight and their requests
share the scheduler's steps."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable, Iterator

ASYNC_THREADS = 256
_POOL: list = []  # made on first use
_LOCK = threading.Lock()


def async_threads() -> ThreadPoolExecutor:
    with _LOCK:
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(ASYNC_THREADS, thread_name_prefix="rf-async"))
        return _POOL[0]


async def in_thread(call: Callable[[], Any]) -> Any:
    """`call()` on a worker thread, awaited."""
    return await asyncio.get_running_loop().run_in_executor(async_threads(), call)


async def iterate_in_thread(it: Iterator) -> AsyncIterator:
    """A blocking iterator's items, each next() on a worker thread; closed if the consumer stops early (so a
    stream's requests are aborted)."""
    done = object()
    try:
        while (item := await in_thread(lambda: next(it, done))) is not done:
            yield item
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            await in_thread(close)
