"""JSON schema -> regex, through outlines-core's `build_regex_from_schema`.

outlines-core ignores some keywords it cannot express and would then let invalid
JSON through; we either express them ourselves or refuse the schema:

- numeric bounds (minimum / maximum / exclusive*) on integer and number nodes, and the
  formats date, date-time (a calendar-correct date) and ipv4, are replaced by a unique
  string const before conversion, and that const's regex is then swapped for ours;
- keywords that constrain values but that no regex here enforces (multipleOf,
  uniqueItems, not, if/then/else, ...) make the schema unsupported (a 400 naming them).
"""

from __future__ import annotations

import functools
import json
from typing import Any, Optional

from outlines_core.json_schema import build_regex_from_schema

from radixflow.constrained.regex_helpers import int_range_regex, integer_bounds, number_range_regex
from radixflow.errors import RadixflowError

COMPACT_WHITESPACE = ""  # no whitespace between tokens: the shortest valid JSON
_PLACEHOLDER = "rfph7q{}z"

_ANNOTATIONS = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly", "$anchor",
}
_SUPPORTED = _ANNOTATIONS | {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs",
    "definitions", "format", "pattern", "minLength", "maxLength",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
}
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")

_DAYS_28 = r"0[1-9]|1[0-9]|2[0-8]"
DATE_REGEX = (  # February stops at 28: always a real date, leap year or not
    rf"[0-9]{{4}}-(?:(?:0[13578]|1[02])-(?:{_DAYS_28}|29|3[01])|(?:0[469]|11)-(?:{_DAYS_28}|29|30)|02-(?:{_DAYS_28}))"
)
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_URI_CHAR = r"[A-Za-z0-9._~%!$&'()*+,;=:@/?#-]"  # no quote, backslash or space: stays a JSON string
_OUTLINES_FORMATS = ("time", "uuid")
_FORMATS = {  # outlines-core's email and uri regexes let `"` into the string (invalid JSON)
    "date": f'"{DATE_REGEX}"',
    "date-time": f'"{DATE_REGEX}T{_TIME}"',
    "ipv4": rf'"{_OCTET}(?:\.{_OCTET}){{3}}"',
    "email": r'"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,12}"',
    "uri": rf'"(?:https?|ftp)://[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*(?::[0-9]{{1,5}})?(?:[/?#]{_URI_CHAR}*)?"',
}


def regex_for_schema(schema: Any, whitespace: Optional[str] = COMPACT_WHITESPACE) -> str:
    """A regex whose matches are exactly (a subset of) the JSON documents valid under
    `schema` (a dict or its JSON text). Raises RadixflowError naming what is unsupported."""
    text = schema if isinstance(schema, str) else json.dumps(schema)
    return _regex_for_text(text, whitespace)


@functools.lru_cache(maxsize=256)
def _regex_for_text(text: str, whitespace: Optional[str]) -> str:
    schema = _parse(text)
    swaps: dict[str, str] = {}
    schema = _rewrite(schema, swaps, "#")
    try:
        regex = build_regex_from_schema(json.dumps(schema), whitespace)
    except (ValueError, TypeError) as e:
        first = str(e).strip().splitlines()[0]
        raise RadixflowError(f"unsupported JSON schema: {first}") from None
    for name, sub in swaps.items():
        rendered = f'"{name}"'
        if rendered not in regex:
            raise RadixflowError(f"unsupported JSON schema: could not place the rule for {name}")
        regex = regex.replace(rendered, f"(?:{sub})")
    return regex


def _parse(text: str) -> dict:
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise RadixflowError(f"json_schema is not valid JSON: {e}") from None
    if not isinstance(schema, dict):
        raise RadixflowError("json_schema must be a JSON object (a schema), e.g. {\"type\": \"object\", ...}")
    _check_schema(schema)
    return schema


def _check_schema(schema: dict) -> None:
    try:
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError
    except ImportError:  # validation of the schema itself is best-effort
        return
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        path = "/".join(str(p) for p in e.path) or "(root)"
        raise RadixflowError(f"invalid JSON schema at {path}: {e.message}") from None


def _rewrite(node: Any, swaps: dict, path: str) -> Any:
    """A copy of the schema with our own rules swapped in as placeholders."""
    if not isinstance(node, dict):
        return node
    unknown = sorted(set(node) - _SUPPORTED)
    if unknown:
        raise RadixflowError(
            f"unsupported JSON schema keyword(s) {', '.join(unknown)} at {path}; remove them "
            "(they would not be enforced)"
        )
    if len(node.get("allOf", [])) > 1:
        raise RadixflowError(f"allOf with several subschemas at {path} is not supported; merge them into one")
    node = _split_typed_bounds(node)
    own = _own_regex(node, path)
    if own is not None:
        name = _PLACEHOLDER.format(len(swaps))
        swaps[name] = own
        return {"const": name}
    out = dict(node)
    for key in _SUBSCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            out[key] = {k: _rewrite(v, swaps, f"{path}/{key}/{k}") for k, v in node[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(node.get(key), list):
            out[key] = [_rewrite(v, swaps, f"{path}/{key}/{i}") for i, v in enumerate(node[key])]
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            out[key] = _rewrite(node[key], swaps, f"{path}/{key}")
    return out


def _split_typed_bounds(node: dict) -> dict:
    """{"type": ["integer", "null"], "minimum": 0} -> anyOf of one node per type."""
    types = node.get("type")
    if not isinstance(types, list) or not any(k in node for k in _BOUNDS + ("format",)):
        return node
    rest = {k: v for k, v in node.items() if k != "type"}
    return {"anyOf": [{**rest, "type": t} for t in types]}


def _own_regex(node: dict, path: str) -> Optional[str]:
    if "enum" in node or "const" in node:
        return None
    kind = node.get("type")
    if kind in ("integer", "number") and any(k in node for k in _BOUNDS):
        return _bounded_number(node, kind == "integer", path)
    fmt = node.get("format")
    if kind == "string" and fmt is not None and fmt not in _FORMATS and fmt not in _OUTLINES_FORMATS:
        known = ", ".join(sorted(set(_FORMATS) | set(_OUTLINES_FORMATS)))
        raise RadixflowError(f"string format {fmt!r} at {path} is not supported; use one of {known} or a pattern")
    if kind == "string" and fmt in _FORMATS:
        if any(k in node for k in ("pattern", "minLength", "maxLength")):
            raise RadixflowError(f"format {node['format']} with pattern/minLength/maxLength at {path} is not supported")
        return _FORMATS[node["format"]]
    return None


def _bounded_number(node: dict, integer: bool, path: str) -> str:
    vals = [node.get(k) for k in _BOUNDS]
    if any(isinstance(v, bool) for v in vals):
        raise RadixflowError(f"boolean exclusiveMinimum/exclusiveMaximum (draft 4) at {path}: use numbers")
    lo, hi, elo, ehi = vals
    if integer:
        return int_range_regex(*integer_bounds(lo, hi, elo, ehi))
    return number_range_regex(lo, hi, elo, ehi)

