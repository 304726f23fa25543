"""Grammar specs as users give them -> one regex; cheap up-front validation.

`validate(kind, spec)` runs before a request is queued (RequestBuilder), so a bad
grammar is a 400 before any compute. For the outlines backend it converts the spec to a
regex; the regex's DFA is built by the compile on the worker pool, under the compile time
limit (regex_guard.py), never on the request path.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Optional

from outlines_core import Index, Vocabulary

from radixflow.constrained.grammar_errors import summary
from radixflow.constrained.json_any import DEFAULT_DEPTH
from radixflow.constrained.json_schema import COMPACT_WHITESPACE, regex_for_schema
from radixflow.constrained.options import DEFAULT_BACKEND
from radixflow.constrained.regex_helpers import ecma_regex
from radixflow.constrained.spec_checks import check_spec, strip_anchors
from radixflow.errors import GrammarError

_BYTE_EOS = 256


def to_regex(
    kind: str, spec: Any, whitespace: Optional[str] = COMPACT_WHITESPACE, any_depth: int = DEFAULT_DEPTH
) -> str:
    """The regex a grammar compiles to on the outlines backend (`whitespace`, `any_depth`:
    JSON schemas only). Raises GrammarError."""
    check_spec(kind, spec)
    if kind == "regex":
        return ecma_regex(strip_anchors(spec))
    if kind == "json_schema":
        return regex_for_schema(spec, whitespace, any_depth)
    raise GrammarError("ebnf grammars need the llguidance grammar backend (--grammar-backend llguidance)")


def validate(kind: str, spec: Any, backend: str = DEFAULT_BACKEND) -> None:
    """Cheap up-front check for `backend`; raises GrammarError when the grammar is invalid
    or unsupported (the compile itself may still refuse it later, also as a 400). A grammar
    that passed is remembered: a batch of requests with one schema is checked once, not once
    a request (llguidance's check is not free: it parses the grammar)."""
    if isinstance(spec, str):
        return _validate_text(kind, spec, backend)
    return _validate(kind, spec, backend)


@functools.lru_cache(maxsize=512)
def _validate_text(kind: str, spec: str, backend: str) -> None:
    return _validate(kind, spec, backend)  # a GrammarError is raised, not cached


def _validate(kind: str, spec: Any, backend: str) -> None:
    if backend in ("llguidance", "auto") or kind == "ebnf":  # auto serves a grammar's first requests on llguidance
        from radixflow.constrained.llguidance_text import validate_grammar

        return validate_grammar(kind, spec)
    to_regex(kind, spec)


@functools.lru_cache(maxsize=1)
def _byte_vocabulary() -> Vocabulary:
    return Vocabulary(_BYTE_EOS, {bytes([b]): [b] for b in range(256)})


@functools.lru_cache(maxsize=512)
def check_regex(regex: str) -> None:
    try:
        Index(regex, _byte_vocabulary())
    except ValueError as e:
        raise GrammarError(regex_error(regex, str(e))) from None


def regex_error(regex: str, detail: str) -> str:
    first = summary(detail)
    if "anchored" in first or "look" in first:
        hint = "anchors and look-arounds (^, $, \\b, (?=...)) are not supported inside a regex; remove them"
    elif "incompatible" in first:
        hint = "no sequence of this model's tokens can produce it; use characters the model's vocabulary has"
    else:
        hint = "use plain regex syntax: no look-arounds, back-references or \\b/\\Z assertions"
        syntax = _syntax_error(regex)
        if syntax:  # outlines-core's own message does not say what is wrong ("error building NFA")
            hint = f"{syntax}; {hint}"
    short = regex if len(regex) <= 120 else regex[:117] + "..."
    return f"invalid or unsupported regex {short!r}: {first}; {hint}"


def _syntax_error(regex: str) -> str:
    """Python's account of a syntax error in `regex` ("missing ), unterminated subpattern at position 0"), or ""."""
    try:
        re.compile(regex)
    except re.error as e:
        return str(e)
    except (RecursionError, OverflowError):
        return ""
    return ""
