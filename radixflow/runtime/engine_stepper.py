"""Lets many threads share one in-process Engine's scheduler, and its batches.

The scheduler is single-threaded. Callers never touch it directly: they queue work
(`call`: add requests, submit programs, abort) and then wait for their requests with
`run_until`. While anyone waits, one loop on the stepper's worker thread runs the queued
work and scheduler steps back to back, so the requests of every waiting thread go into the
same forward passes, as they would over HTTP. After each turn the loop checks each waiter's
condition and wakes only those whose condition holds (and those that asked for every turn,
`advance`): a hundred program threads do not all wake, and fight over the GIL, on every
pass while the loop launches the next one.

The step always runs on that one worker thread: device libraries keep per-thread state
(cuBLAS a handle and workspace per thread, OpenMP a thread team), so a hundred program
threads taking turns would each create their own; on a GPU whose memory the KV pool has
taken, those allocations fail.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

IDLE_WAIT_S = 0.005  # the loop's nap when it has waiters but no work (new work wakes it at once)


class AllFinished:
    """A waiter's done() for `items` (requests that are not continued, program runs: each finishes
    once and for good): the loop asks every waiter after every turn, so this goes on from the first
    item not yet seen finished instead of over all of them each time."""

    def __init__(self, items: list) -> None:
        self.items = items
        self.seen = 0  # items[:seen] are finished

    def __call__(self) -> bool:
        items, i = self.items, self.seen
        while i < len(items) and items[i].finished:
            i += 1
        self.seen = i
        return i == len(items)


@dataclass(eq=False)
class _Waiter:
    done: Callable[[], bool]
    every_turn: bool  # wake after every turn, not only once done() holds
    woken: threading.Event = field(default_factory=threading.Event)
    error: Optional[BaseException] = None


class EngineStepper:
    def __init__(self, scheduler, programs):
        """`programs`: the program executor, advanced before and after each step."""
        self.scheduler = scheduler
        self.programs = programs
        self._cond = threading.Condition()
        self._inbox: list[tuple[Callable[[], Any], Future]] = []
        self._waiters: list[_Waiter] = []
        self._looping = False
        self.steps = 0  # turns of the loop that ran queued work or a scheduler step
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="rf-engine")

    def call(self, fn: Callable[[], Any]) -> Future:
        """Queue fn to run on the worker thread before the next step; the Future holds its
        result or exception."""
        fut: Future = Future()
        with self._cond:
            self._inbox.append((fn, fut))
            self._cond.notify_all()
        return fut

    def run_until(self, done: Callable[[], bool]) -> None:
        """Wait until done() holds, the scheduler stepping meanwhile."""
        self._wait(done, every_turn=False)

    def advance(self, done: Callable[[], bool]) -> bool:
        """Wait for one turn of the loop (or none if done() holds already); True once done() holds."""
        self._wait(done, every_turn=True)
        return done()

    def exclusive(self, fn: Callable[[], Any]) -> Any:
        """Run fn with the scheduler to ourselves (between steps)."""
        fut = self.call(fn)
        self.run_until(fut.done)
        return fut.result()

    def _wait(self, done: Callable[[], bool], every_turn: bool) -> None:
        w = _Waiter(done, every_turn)
        with self._cond:
            if done():
                return
            self._waiters.append(w)
            self._cond.notify_all()
            if not self._looping:
                self._looping = True
                self._worker.submit(self._loop)
        try:
            w.woken.wait()
        finally:
            with self._cond:
                if w in self._waiters:  # interrupted (KeyboardInterrupt) before it was woken
                    self._waiters.remove(w)
        if w.error is not None:
            raise w.error

    # -- the worker thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while self._turn():
                pass
        except BaseException as e:  # handed to everyone waiting; the next waiter starts a new loop
            with self._cond:
                waiters, self._waiters, self._looping = self._waiters, [], False
            for w in waiters:
                w.error = e
                w.woken.set()

    def _turn(self) -> bool:
        """Queued work, then one scheduler step unless every waiter is done; False when
        nobody waits any more (the loop ends)."""
        with self._cond:
            inbox, self._inbox = self._inbox, []
        for fn, fut in inbox:
            try:
                fut.set_result(fn())
            except BaseException as e:  # handed to the caller that queued it
                fut.set_exception(e)
        ran = bool(inbox)
        # new programs start, aborted ones end, and runs woken by a turn that raised after their request
        # finished go on; the executor looks only at runs woken since its last on_step (none: nothing to do)
        self.programs.on_step()
        if not self._wake(after_turn=False):
            self._count(ran)
            return False
        if self.scheduler.has_work():
            self.scheduler.step()
            self.programs.on_step()
            ran = True
        else:
            with self._cond:
                if not self._inbox:
                    self._cond.wait(IDLE_WAIT_S)
        self._count(ran)
        return self._wake(after_turn=ran)

    def _count(self, ran: bool) -> None:
        with self._cond:
            self.steps += ran

    def _wake(self, after_turn: bool) -> bool:
        """Wake the waiters that are done (and after a turn those that wait for every turn);
        True while some remain. The last one leaving ends the loop here, under the lock, so a
        new waiter either is seen by this loop or starts the next one."""
        with self._cond:
            for w in list(self._waiters):
                try:
                    wake = (after_turn and w.every_turn) or w.done()
                except BaseException as e:
                    w.error, wake = e, True
                if wake:
                    self._waiters.remove(w)
                    w.woken.set()
            if not self._waiters:
                self._looping = False
            return bool(self._waiters)

    def close(self) -> None:
        self._worker.shutdown(wait=False)
