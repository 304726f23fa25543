"""GrammarError from a backend's message: which keyword is at fault, and where.

Backends report e.g. `Unimplemented keys: ["uniqueItems"]` without a location; the
pointer is found by walking the schema for the first place the keyword appears.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterator, Optional

from radixflow.errors import GrammarError

_UNIMPLEMENTED = re.compile(r'Unimplemented keys: \["([^"]+)"')
_UNKNOWN_FORMAT = re.compile(r"Unknown format: (\S+)")
_BAD_POINTER = re.compile(r"Pointer '([^']*)' does not exist")
# llguidance's regex engine's name for a lexeme no text matches
_EMPTY_LANGUAGE = "NoExtensionBias"
_EMPTY_MEANING = ("it matches no text at all (e.g. a character class that excludes every character, "
                  "or a rule or $ref that only refers to itself)")


def escape_pointer(key: str) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def walk(node: Any, pointer: str = "") -> Iterator[tuple[str, dict]]:
    """(pointer, subschema) for every dict in the schema, depth first."""
    if isinstance(node, dict):
        yield pointer, node
        for k, v in node.items():
            yield from walk(v, f"{pointer}/{escape_pointer(k)}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, f"{pointer}/{i}")


def find_keyword(schema: Any, keyword: str, value: Any = None) -> Optional[str]:
    """JSON pointer of the first subschema that has `keyword` (with `value`, if given)."""
    for pointer, node in walk(schema):
        if keyword in node and (value is None or node[keyword] == value):
            return f"{pointer}/{escape_pointer(keyword)}"
    return None


def summary(detail: str, fallback: str = "cannot be compiled") -> str:
    """A backend's message in one line: its first line, and where that ends in a colon ("regex parse error:",
    which says nothing alone), the regex library's "error: ..." line after it (e.g. "unclosed group")."""
    lines = [line.strip() for line in detail.strip().splitlines() if line.strip()]
    if not lines:
        return fallback
    if lines[0] == _EMPTY_LANGUAGE:
        return _EMPTY_MEANING
    cause = next((line[len("error:"):].strip() for line in lines[1:] if line.startswith("error:")), None)
    return f"{lines[0]} {cause}" if cause and lines[0].endswith(":") else lines[0]


def grammar_error(detail: str, schema: Any = None) -> GrammarError:
    """A GrammarError for a backend's message about `schema` (a dict, its JSON text, or None)."""
    first = summary(detail)
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            schema = None
    keyword, pointer, hint = None, None, "simplify the schema"
    m = _UNIMPLEMENTED.search(first)
    if m:
        keyword = m.group(1)
        hint = f"radixflow cannot enforce '{keyword}'; remove it"
    elif _UNKNOWN_FORMAT.search(first):
        keyword = "format"
        value = _UNKNOWN_FORMAT.search(first).group(1)
        pointer = find_keyword(schema, "format", value)
        hint = "use a supported format or a pattern"
    elif _BAD_POINTER.search(first):
        keyword = "$ref"
        hint = "point $ref at a definition that exists"
    elif "coerce_one_of" in first:  # llguidance's option, not ours to turn on: say what the user can change
        keyword, first = "oneOf", "oneOf branches that may both match one value are not supported"
        hint = ("make the branches exclusive (different types, different const / enum values, or a required property "
                "with different const values), or use anyOf")
    elif "Unsatisfiable" in first:
        hint = "no JSON value satisfies it; fix the schema"
    elif "too big" in first or "limit" in first:
        hint = "the grammar is too large to compile; make enums, patterns or nesting smaller"
    if keyword and pointer is None and schema is not None:
        pointer = find_keyword(schema, keyword)
    where = f" at {pointer or '#'}" if keyword else ""
    what = f"keyword '{keyword}'{where}: " if keyword else ""
    return GrammarError(f"unsupported JSON schema: {what}{first}; {hint}", keyword=keyword, pointer=pointer)
