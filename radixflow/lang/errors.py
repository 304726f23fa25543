"""Errors of LLM programs."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Callable

from radixflow.errors import RadixflowError


class ProgramError(RadixflowError):
    """A program failed; the message names the program variable (gen/select) involved."""


class GenerationError(ProgramError):
    """A gen or select the backend refused or failed: the program's inputs, not its Python (run_batch keeps the
    batch's other programs, as SGLang does)."""


class NotTraceable(Exception):
    """The program cannot become a static request graph (it runs eagerly instead)."""


class DataDependentError(NotTraceable):
    """The program used a generated value in Python (control flow, string methods...). Raising one is remembered
    (`raised_while_tracing`): a broad `except` in the program must not make its trace look complete."""

    def __init__(self, *args):
        super().__init__(*args)
        _RAISED.set(True)


_RAISED: ContextVar[bool] = ContextVar("radixflow_data_dependent_raised", default=False)


def raised_while_tracing(run: Callable[[], Any]) -> bool:
    """Runs `run` (a trace) and says whether a DataDependentError was raised meanwhile, caught or not."""
    token = _RAISED.set(False)
    try:
        run()
        return _RAISED.get()
    finally:
        _RAISED.reset(token)
