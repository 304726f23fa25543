"""Lets many threads share one in-process Engine's scheduler, and its batches.

The scheduler is single-threaded. Callers never touch it directly: they queue work
(`call`: add requests, submit programs, abort) and then wait for their requests with
`run_until`. Whichever waiting thread finds nobody stepping becomes the driver: it has
the queued work and one scheduler step run, then lets the next waiter take over. So the
requests of every thread that is waiting go into the same forward passes, as they
would over HTTP.

The step itself always runs on the stepper's one worker thread, whoever drives: device
libraries keep per-thread state (cuBLAS a handle and workspace per thread, OpenMP a
thread team), so a hundred program threads taking turns would each create their own;
on a GPU whose memory the KV pool has taken, those allocations fail.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable


class EngineStepper:
    def __init__(self, scheduler, programs):
        """`programs`: the program executor, advanced before and after each step."""
        self.scheduler = scheduler
        self.programs = programs
        self._cond = threading.Condition()
        self._inbox: list[tuple[Callable[[], Any], Future]] = []
        self._driving = False
        self.steps = 0  # driver turns so far (a waiter sleeps until this moves)
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="rf-engine")

    def call(self, fn: Callable[[], Any]) -> Future:
        """Queue fn to run on the driver's thread before its next step; the Future holds
        its result or exception."""
        fut: Future = Future()
        with self._cond:
            self._inbox.append((fn, fut))
            self._cond.notify_all()
        return fut

    def run_until(self, done: Callable[[], bool]) -> None:
        while not self.advance(done):
            pass

    def advance(self, done: Callable[[], bool]) -> bool:
        """Make one round of progress (drive it, or wait for the thread driving); True
        once done() holds."""
        with self._cond:
            if done():
                return True
            if self._driving:
                seen = self.steps
                self._cond.wait_for(lambda: self.steps != seen or not self._driving)
                return done()
            self._driving = True
            inbox, self._inbox = self._inbox, []
        try:
            self._worker.submit(self._drive, inbox, done).result()
        finally:
            with self._cond:
                self._driving = False
                self.steps += 1
                self._cond.notify_all()
        return done()

    def exclusive(self, fn: Callable[[], Any]) -> Any:
        """Run fn with the scheduler to ourselves (between steps)."""
        fut = self.call(fn)
        self.run_until(fut.done)
        return fut.result()

    def _drive(self, inbox: list, done: Callable[[], bool]) -> None:
        for fn, fut in inbox:
            try:
                fut.set_result(fn())
            except BaseException as e:  # handed to the caller that queued it
                fut.set_exception(e)
        self.programs.on_step()
        if done():
            return
        if self.scheduler.has_work():
            self.scheduler.step()
            self.programs.on_step()

    def close(self) -> None:
        self._worker.shutdown(wait=False)
