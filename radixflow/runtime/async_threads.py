"""One shared pool of worker threads for async APIs that wrap blocking calls (`Engine.async_generate`,
`f.run_async`): each waiting call holds a thread, so an event loop can have many in flight and their requests
share the scheduler's steps."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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


@dataclass
class _Raised:
    error: BaseException


AHEAD = 4  # items the worker may produce before the consumer takes them


async def iterate_in_thread(it: Iterator) -> AsyncIterator:
    """A blocking iterator's items, produced by one worker thread that owns it: a generator cannot be closed from
    another thread while it runs, so when the consumer stops early (a break, a cancellation) the worker closes it
    after its current item (a stream's requests are then aborted). The worker runs at most AHEAD items ahead."""
    loop, items, stop, end = asyncio.get_running_loop(), asyncio.Queue(), threading.Event(), object()
    room = threading.Semaphore(AHEAD)

    def send(item: Any) -> bool:
        while not room.acquire(timeout=0.1):
            if stop.is_set():
                return False
        try:
            loop.call_soon_threadsafe(items.put_nowait, item)
        except RuntimeError:  # the event loop is gone: nobody reads on
            return False
        return not stop.is_set()

    def produce() -> None:
        try:
            for item in it:
                if not send(item):
                    break
            else:
                send(end)
        except BaseException as e:
            send(_Raised(e))
        finally:
            getattr(it, "close", lambda: None)()

    async_threads().submit(produce)
    try:
        while (item := await items.get()) is not end:
            room.release()
            if isinstance(item, _Raised):
                raise item.error
            yield item
    finally:
        stop.set()
