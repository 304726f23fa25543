"""Short sample strings for the closing-path search to try where a greedy walk cannot find
one: the shortest string a `pattern` matches, a sample of each `format`, a string of
`minLength` characters.

A walk over masks sees no progress inside an unanchored pattern (`.*\\.alfredworkflow`
allows every character until the suffix is spelled) or a long `minLength`; a sample
string, tried as tokens against the matcher, is either accepted there or passed over, so a
wrong sample costs a try and never an invalid output.

    hint_strings("json_schema", schema)   # ['a@a.aa', '0000-00-00', ...] (JSON-escaped)
    hint_strings("regex", "[a-f0-9]{32}") # ['00000000000000000000000000000000']
"""

from __future__ import annotations

import json
import re
import warnings
from typing import Any, Optional

MAX_HINTS = 16
MAX_HINT_CHARS = 256

FORMAT_SAMPLES = {
    "date-time": "2000-01-01T00:00:00Z", "date": "2000-01-01", "time": "00:00:00Z", "duration": "P1D",
    "email": "a@a.aa", "idn-email": "a@a.aa", "hostname": "a", "idn-hostname": "a",
    "ipv4": "0.0.0.0", "ipv6": "::", "uuid": "00000000-0000-0000-0000-000000000000",
    "uri": "a:a", "uri-reference": "a", "iri": "a:a", "iri-reference": "a", "uri-template": "a",
    "json-pointer": "", "relative-json-pointer": "0", "regex": "a",
}  # fmt: skip


def hint_strings(kind: str, spec: Any) -> list:
    """Sample strings for a grammar: raw for a regex, JSON-escaped (string content without
    the quotes) for a JSON schema. Empty for other kinds."""
    if kind == "regex":
        hints = [shortest_match(spec)]
    elif kind == "json_schema":
        doc = json.loads(spec) if isinstance(spec, str) else spec
        hints = [json.dumps(h, ensure_ascii=False)[1:-1] for h in _schema_samples(doc, [])]
    else:
        return []
    out: list = []
    for h in hints:
        if h and h not in out and len(h) <= MAX_HINT_CHARS:
            out.append(h)
    return out[:MAX_HINTS]


def _schema_samples(node: Any, out: list) -> list:
    if isinstance(node, list):
        for item in node:
            _schema_samples(item, out)
    elif isinstance(node, dict):
        _one_schema(node, out)
        for key, value in node.items():
            if key in ("properties", "patternProperties", "$defs", "definitions") and isinstance(value, dict):
                for sub in value.values():
                    _schema_samples(sub, out)
            elif key not in ("enum", "const", "default", "examples") and isinstance(value, (dict, list)):
                _schema_samples(value, out)
    return out


def _one_schema(node: dict, out: list) -> None:
    minimum = node.get("minLength") if isinstance(node.get("minLength"), int) else 0
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        s = shortest_match(pattern)
        if s is not None:
            out.append(s + "a" * max(0, minimum - len(s)))
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt in FORMAT_SAMPLES:
        out.append(FORMAT_SAMPLES[fmt])
    if minimum > 1 and not isinstance(pattern, str):
        out.extend(["a" * minimum, "0" * minimum])
    patterns = node.get("patternProperties")
    if isinstance(patterns, dict):
        out.extend(s for s in map(shortest_match, patterns) if s is not None)


def shortest_match(pattern: str) -> Optional[str]:
    """A short string `pattern` matches (read with Python's regex parser, close to ECMA-262
    for what schemas use); None when it cannot be read."""
    try:
        from re import _parser as parser  # Python 3.11+
    except ImportError:  # pragma: no cover
        import sre_parse as parser  # type: ignore[no-redef]
    try:
        with warnings.catch_warnings():  # FutureWarning on ECMA-style classes such as `[[a]`
            warnings.simplefilter("ignore")
            return _shortest(parser.parse(pattern))
    except (re.error, RecursionError, ValueError, TypeError, OverflowError):
        return None


def _shortest(items) -> str:
    return "".join(_one(op, av) for op, av in items)


def _one(op, av) -> str:
    name = str(op)
    if name == "LITERAL":
        return chr(av)
    if name == "NOT_LITERAL":
        return "a" if av != ord("a") else "b"
    if name == "ANY":
        return "a"
    if name == "IN":
        return _from_class(av)
    if name == "BRANCH":
        return min((_shortest(b) for b in av[1]), key=len)
    if name == "SUBPATTERN":
        return _shortest(av[-1])
    if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
        low, _high, sub = av
        return _shortest(sub) * low
    if name == "ATOMIC_GROUP":
        return _shortest(av)
    return ""  # anchors, lookarounds, back references: nothing (the matcher has the last word)


def _from_class(items) -> str:
    """A character of a class, preferring `a`, then `0`, then the first one listed."""
    negate = any(str(op) == "NEGATE" for op, _ in items)
    for c in "a0":
        inside = any(_in_item(op, av, c) for op, av in items)
        if inside != negate:
            return c
    if negate:
        return "b"
    for op, av in items:
        if str(op) == "LITERAL":
            return chr(av)
        if str(op) == "RANGE":
            return chr(av[0])
        if str(op) == "CATEGORY":
            return {"CATEGORY_SPACE": " ", "CATEGORY_NOT_DIGIT": "a"}.get(str(av), "_")
    return "a"


def _in_item(op, av, c: str) -> bool:
    name = str(op)
    if name == "LITERAL":
        return chr(av) == c
    if name == "RANGE":
        return av[0] <= ord(c) <= av[1]
    if name == "CATEGORY":
        return {"CATEGORY_DIGIT": c.isdigit(), "CATEGORY_WORD": c.isalnum(), "CATEGORY_NOT_SPACE": True,
                "CATEGORY_NOT_DIGIT": not c.isdigit(), "CATEGORY_NOT_WORD": False}.get(str(av), False)  # fmt: skip
    return False
