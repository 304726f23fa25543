"""A request graph's state in the executor (program_executor.py): the run, its strands, and which
runs the executor's next `on_step` must look at.

on_step used to poll every strand of every run after each scheduler step; with 64 programs of
a few strands each that was tens of milliseconds a round of the engine thread's time between
forward passes, while most strands wait for a request that has not finished. A strand's state
changes only when one of its run's requests finishes (every path ends in `Req.finish`, which
calls the request's `on_finish`: the run's `woken`), when the run is submitted, or when it
fails (`fail`: an abort, an interrupt, an error). Those wake the run; `Wakeups.take` hands the
woken ones to on_step, plus every streamed run (its main strand's text grows with each token,
which finishes nothing)."""

from __future__ import annotations

import operator
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from radixflow.runtime.programs.gen_logprobs import GenLogprobs
from radixflow.runtime.programs.program_stream import StrandStream
from radixflow.runtime.scheduling.req import Req

RUNNABLE, GEN, SAMPLES, SELECT, JOIN, DONE = "runnable", "gen", "samples", "select", "join", "done"


@dataclass(eq=False)
class ProgramRun:
    rid: str
    on_done: Optional[Callable[[dict], None]] = None
    strands: list = field(default_factory=list)
    results: dict = field(default_factory=dict)
    reqs: list = field(default_factory=list)  # every scheduler request it issued
    segments: int = 0  # gen segments run by continuing a request
    error: Optional[str] = None
    status_code: int = 200  # of the error: 400 bad input, 500 internal; 200 for an abort
    created: float = field(default_factory=time.time)
    output: Optional[dict] = None
    pieces: dict = field(default_factory=dict)  # text pieces tokenized ahead (text_pieces.py)
    seq: int = 0  # submission order: woken runs are advanced in it, as all were before
    wake: Optional[Callable[["ProgramRun"], None]] = field(default=None, repr=False)  # Wakeups.wake

    @property
    def finished(self) -> bool:
        return self.output is not None

    def fail(self, message: str, status_code: int = 400) -> None:
        if self.error is None:
            self.error, self.status_code = message, status_code
        self.woken()

    def woken(self, _req: Optional[Req] = None) -> None:
        """The next on_step must look at this run (also each of its requests' `on_finish`)."""
        if self.wake is not None:
            self.wake(self)


@dataclass(eq=False)
class Strand:
    run: ProgramRun
    ops: list
    ids: list
    vars: dict
    pc: int = 0
    pending: str = ""
    state: str = RUNNABLE
    req: Optional[Req] = None
    choice: list = field(default_factory=list)  # (cond reqs, uncond reqs, choice ids, prefix len)
    samples: list = field(default_factory=list)  # the requests of a gen with n > 1
    text: str = ""  # all text appended since the strand began (for a concatenating join)
    stream: Optional[StrandStream] = None  # the main strand of a streamed run
    logprobs: Optional[GenLogprobs] = None  # the running gen's, if it asks for them
    children: dict = field(default_factory=dict)
    fork_base: dict = field(default_factory=dict)
    produced: list = field(default_factory=list)


class Wakeups:
    """The runs woken since the last `take`, and the streamed runs (looked at every time)."""

    def __init__(self) -> None:
        self._woken: dict[ProgramRun, None] = {}
        self._streamed: dict[ProgramRun, None] = {}

    def add(self, run: ProgramRun, streamed: bool) -> None:
        """A new run: woken, so that the next on_step starts it."""
        run.wake = self.wake
        if streamed:
            self._streamed[run] = None
        self.wake(run)

    def wake(self, run: ProgramRun) -> None:
        self._woken[run] = None

    def take(self) -> list[ProgramRun]:
        """The runs to look at now, in submission order; runs woken while they are looked at wait
        for the next call."""
        woken, self._woken = self._woken, {}
        woken.update(self._streamed)
        return sorted(woken, key=operator.attrgetter("seq"))

    def drop(self, run: ProgramRun) -> None:
        """A finished run: never looked at again."""
        run.wake = None
        self._woken.pop(run, None)
        self._streamed.pop(run, None)
