"""The checks every grammar backend shares, before any compile: the kind, the spec's type, a JSON
schema's nesting, and regex anchors (which add nothing: the whole output has to match)."""

from __future__ import annotations

import json
from typing import Any

from radixflow.errors import GrammarError

KINDS = ("regex", "json_schema", "ebnf")
MAX_SCHEMA_DEPTH = 128


def check_spec(kind: str, spec: Any) -> None:
    """The checks every backend shares: the kind, the spec's type, a JSON schema's nesting."""
    if kind not in KINDS:
        raise GrammarError(f"unknown grammar kind {kind!r}; use one of {', '.join(KINDS)}")
    if kind == "json_schema":
        if not isinstance(spec, (str, dict)):
            raise GrammarError("json_schema must be a JSON schema object or its JSON text")
        if not isinstance(check_nesting(spec), dict):  # `true` is a schema, but llguidance's message for it was internal
            raise GrammarError('json_schema must be a JSON object (a schema), e.g. {"type": "object"}; for any JSON value use {}')
    elif not isinstance(spec, str) or not spec:
        raise GrammarError(f"{kind} must be a non-empty string")


def check_nesting(schema: Any) -> Any:
    """Refuse schemas nested deeper than MAX_SCHEMA_DEPTH (iteratively: no recursion limit); returns the schema parsed."""
    too_deep = GrammarError(
        f"json_schema is nested too deeply (over {MAX_SCHEMA_DEPTH} levels of objects/arrays); flatten it or use $ref"
    )
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except RecursionError:
            raise too_deep from None
        except ValueError as e:
            raise GrammarError(f"json_schema is not valid JSON: {e}") from None
    stack, depth = [(schema, 1)], 0
    while stack and depth <= MAX_SCHEMA_DEPTH:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    if depth > MAX_SCHEMA_DEPTH:
        raise too_deep
    return schema


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
