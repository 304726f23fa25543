"""Grammar specs as users give them -> one regex; cheap up-front validation.

`validate(kind, spec)` runs before a request is queued (RequestBuilder), so a bad
grammar is a 400 before any compute: a regex is checked by building its DFA over a
256-token byte vocabulary (the same regex engine as the real compile, milliseconds);
a JSON schema by checking it and converting it to a regex.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

from outlines_core import Index, Vocabulary

from radixflow.constrained.json_any import DEFAULT_DEPTH
from radixflow.constrained.json_schema import COMPACT_WHITESPACE, regex_for_schema
from radixflow.errors import RadixflowError

KINDS = ("regex", "json_schema", "ebnf")
_BYTE_EOS = 256


def strip_anchors(regex: str) -> str:
    """`^...$` -> `...`: the whole output always has to match, so anchors add nothing
    (and the DFA compiler rejects them)."""
    if regex.startswith("^"):
        regex = regex[1:]
    if regex.endswith("$") and not _escaped(regex, len(regex) - 1):
        regex = regex[:-1]
    return regex


def _escaped(text: str, pos: int) -> bool:
    slashes = 0
    while pos - slashes - 1 >= 0 and text[pos - slashes - 1] == "\\":
        slashes += 1
    return slashes % 2 == 1


def to_regex(
    kind: str, spec: Any, whitespace: Optional[str] = COMPACT_WHITESPACE, any_depth: int = DEFAULT_DEPTH
) -> str:
    """The regex a grammar compiles to (`whitespace`, `any_depth`: JSON schemas only).
    Raises RadixflowError."""
    if kind == "regex":
        if not isinstance(spec, str) or not spec:
            raise RadixflowError("regex must be a non-empty string")
        return strip_anchors(spec)
    if kind == "json_schema":
        if not isinstance(spec, (str, dict)):
            raise RadixflowError("json_schema must be a JSON schema object or its JSON text")
        return regex_for_schema(spec, whitespace, any_depth)
    if kind == "ebnf":
        raise RadixflowError("ebnf grammars are not supported; express the grammar as a regex or a json_schema")
    raise RadixflowError(f"unknown grammar kind {kind!r}; use one of {', '.join(KINDS)}")


def validate(kind: str, spec: Any) -> None:
    """Raises RadixflowError when the grammar is invalid or unsupported."""
    regex = to_regex(kind, spec)
    if kind == "regex":
        check_regex(regex)


@functools.lru_cache(maxsize=1)
def _byte_vocabulary() -> Vocabulary:
    return Vocabulary(_BYTE_EOS, {bytes([b]): [b] for b in range(256)})


@functools.lru_cache(maxsize=512)
def check_regex(regex: str) -> None:
    try:
        Index(regex, _byte_vocabulary())
    except ValueError as e:
        raise RadixflowError(regex_error(regex, str(e))) from None


def regex_error(regex: str, detail: str) -> str:
    first = detail.strip().splitlines()[0] if detail.strip() else "cannot be compiled"
    if "anchored" in first or "look" in first:
        hint = "anchors and look-arounds (^, $, \\b, (?=...)) are not supported inside a regex; remove them"
    elif "incompatible" in first:
        hint = "no sequence of this model's tokens can produce it; use characters the model's vocabulary has"
    else:
        hint = "use plain regex syntax: no look-arounds, back-references or \\b/\\Z assertions"
    short = regex if len(regex) <= 120 else regex[:117] + "..."
    return f"invalid or unsupported regex {short!r}: {first}; {hint}"
