"""Errors of LLM programs."""

from __future__ import annotations

from radixflow.errors import RadixflowError


class ProgramError(RadixflowError):
    """A program failed; the message names the program variable (gen/select) involved."""


class NotTraceable(Exception):
    """The program cannot become a static request graph (it runs eagerly instead)."""


class DataDependentError(NotTraceable):
    """The program used a generated value in Python (control flow, string methods...)."""
