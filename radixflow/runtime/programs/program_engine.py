"""Request graphs on the in-process Engine: submitted to its scheduler's ProgramExecutor
and run in the same steps as whatever other threads run on it (engine.stepper).

Submitting is queued work, not a turn of its own: the driver that picks it up goes on to
the scheduler step in the same turn, so programs submitted together start together (as
eager requests do)."""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future
from typing import Callable, Iterator, Optional

from radixflow.runtime.engine_stepper import AllFinished
from radixflow.runtime.programs.program_executor import ProgramExecutor, ProgramRun
from radixflow.runtime.programs.program_ops import parse_program
from radixflow.runtime.programs.program_stream import delta_event
from radixflow.runtime.programs.text_pieces import constant_pieces


def run_programs(
    engine, programs: list, ops: Optional[list] = None, on_result: Optional[Callable[[int, dict], None]] = None,
    pieces: Optional[list] = None,
) -> list[dict]:  # fmt: skip
    """Run programs to completion; their outputs in order. `ops`: each program's parsed ops
    (program_ops.check_programs), `pieces` its constant pieces (text_pieces.constant_pieces),
    if the caller has them."""
    batch = _submit(engine, programs, ops, on_result, pieces=pieces)
    _wait(engine, batch, batch.finished)
    return [r.output for r in batch.runs]


def stream_program(engine, program: dict, ops: Optional[list] = None) -> Iterator[dict]:
    """{"var", "text"} deltas of the program's main strand as they come (with "meta_info" where
    the gen asks for logprobs), then its output."""
    deltas: deque = deque()  # filled by the thread that runs the scheduler steps
    on_delta = lambda var, text, meta: deltas.append(delta_event(var, text, meta))  # noqa: E731
    batch = _submit(engine, [program], None if ops is None else [ops], on_delta=on_delta)
    try:
        while True:
            _wait(engine, batch, lambda: batch.finished() or bool(deltas))
            while deltas:
                yield deltas.popleft()
            if batch.finished():
                yield batch.runs[0].output
                return
    finally:
        if batch.runs is not None and not batch.finished():  # the caller stopped reading
            engine.stepper.exclusive(lambda: _interrupt(engine.programs, batch.runs))


class _Batch:
    """Programs queued for the engine thread, as their caller waits for them. The stepper asks each
    waiter after every turn; reading the Future there took its lock three times a check."""

    def __init__(self) -> None:
        self.fut: Optional[Future] = None
        self.runs: Optional[list[ProgramRun]] = None  # set on the engine thread before `fut` resolves
        self._all: Optional[AllFinished] = None

    def submitted(self, runs: list[ProgramRun]) -> list[ProgramRun]:
        self.runs, self._all = runs, AllFinished(runs)
        return runs

    def finished(self) -> bool:
        """Every run finished, or the submission failed."""
        return self.fut.done() if self._all is None else self._all()


def _submit(engine, programs: list, ops: Optional[list], on_result=None, on_delta=None, pieces=None) -> _Batch:
    """Queue the programs' submission; the Future holds their ProgramRuns (or the error).
    They are parsed and their constant text is tokenized here, on the caller's thread, not in
    the scheduler's turn."""
    ops = [parse_program(p) for p in programs] if ops is None else ops
    pieces = [constant_pieces(engine.tokenizer, o) for o in ops] if pieces is None else pieces
    batch = _Batch()

    def submit() -> list[ProgramRun]:
        ex = engine.programs
        runs = []
        try:
            for i, p in enumerate(programs):
                done = None if on_result is None else (lambda out, i=i: on_result(i, out))
                runs.append(ex.submit(p, done, on_delta, pieces[i], ops[i]))
        except BaseException:
            _interrupt(ex, runs)
            raise
        return batch.submitted(runs)

    batch.fut = engine.stepper.call(submit)
    return batch


def _wait(engine, batch: _Batch, done: Callable[[], bool]) -> None:
    """Wait until done() (checked once the submission is in); raises the submission's error."""
    try:
        engine.stepper.run_until(done)
    except BaseException:
        if batch.runs is not None:
            engine.stepper.exclusive(lambda: _interrupt(engine.programs, batch.runs))
        raise
    batch.fut.result()


def _interrupt(ex: ProgramExecutor, runs: list) -> None:
    for r in runs:
        if not r.finished:
            r.fail("interrupted", status_code=500)
    ex.on_step()
