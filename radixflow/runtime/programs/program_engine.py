"""Request graphs on the in-process Engine: submitted to its scheduler's ProgramExecutor
and run in the same steps as whatever other threads run on it (engine.stepper)."""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterator, Optional

from radixflow.runtime.programs.program_executor import ProgramExecutor, ProgramRun


def executor_for(engine) -> ProgramExecutor:
    ex = getattr(engine.scheduler, "program_executor", None)
    if ex is None:
        ex = ProgramExecutor(engine.scheduler, engine.tokenizer)
        engine.scheduler.program_executor = ex
    return ex


def run_programs(engine, programs: list, on_result: Optional[Callable[[int, dict], None]] = None) -> list[dict]:
    """Run programs to completion; their outputs in order."""
    runs = _submit(engine, programs, on_result)
    _wait(engine, runs, lambda: all(r.finished for r in runs))
    return [r.output for r in runs]


def stream_program(engine, program: dict) -> Iterator[dict]:
    """{"var", "text"} deltas of the program's main strand as they come, then its output."""
    deltas: deque = deque()  # filled by whichever thread drives the scheduler
    (run,) = _submit(engine, [program], on_delta=lambda var, text: deltas.append({"var": var, "text": text}))
    done = lambda: run.finished or bool(deltas)  # noqa: E731
    try:
        while True:
            _wait(engine, [run], done)
            while deltas:
                yield deltas.popleft()
            if run.finished:
                yield run.output
                return
    finally:
        if not run.finished:  # the caller stopped reading: stop the program, free its KV
            engine.stepper.exclusive(lambda: _interrupt(executor_for(engine), [run]))


def _submit(engine, programs: list, on_result=None, on_delta=None) -> list[ProgramRun]:
    def submit() -> list[ProgramRun]:
        ex = executor_for(engine)
        runs = []
        try:
            for i, p in enumerate(programs):
                done = None if on_result is None else (lambda out, i=i: on_result(i, out))
                runs.append(ex.submit(p, done, on_delta))
        except BaseException:
            _interrupt(ex, runs)
            raise
        return runs

    return engine.stepper.exclusive(submit)


def _wait(engine, runs: list, done: Callable[[], bool]) -> None:
    try:
        engine.stepper.run_until(done)
    except BaseException:
        engine.stepper.exclusive(lambda: _interrupt(executor_for(engine), runs))
        raise


def _interrupt(ex: ProgramExecutor, runs: list) -> None:
    for r in runs:
        if not r.finished:
            r.fail("interrupted", status_code=500)
    ex.on_step()
