"""JSON schema -> regex, through outlines-core's `build_regex_from_schema`.

outlines-core ignores some keywords it cannot express and would then let invalid
JSON through; we either express them ourselves or refuse the schema:

- numeric bounds (minimum / maximum / exclusive*) on integer and number nodes, and the
  formats date, date-time (a calendar-correct date) and ipv4, are replaced by a unique
  string const before conversion, and that const's regex is then swapped for ours;
- keywords that constrain values but that no regex here enforces (multipleOf,
  uniqueItems, not, if/then/else, ...) make the schema unsupported (a 400 naming them).

Free-form nodes (`{}` / `true`: any value; `{"type": "object"}` without properties;
an array without items) get our depth-limited regexes (`json_any`) instead of
outlines-core's generic JSON regex, whose index takes tens of seconds to build. Required
keys that `properties` does not list are added to it (outlines-core would drop them and
emit objects the schema rejects).

`whitespace` is the regex allowed between JSON tokens; None and "" mean compact output.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from outlines_core.json_schema import build_regex_from_schema

from radixflow.constrained.grammar_errors import summary
from radixflow.constrained.json_any import DEFAULT_DEPTH, any_array_regex, any_object_regex, any_value_regex, check_depth
from radixflow.constrained.json_one_of import check_one_of
from radixflow.constrained.regex_helpers import ecma_regex, int_range_regex, integer_bounds, number_range_regex
from radixflow.errors import GrammarError

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
# keywords that constrain values (JSON Schema 2020-12 and earlier drafts); any other
# keyword is an annotation or unknown, and is ignored as the specification says
_VALIDATION = _SUPPORTED - _ANNOTATIONS | {
    "multipleOf", "uniqueItems", "contains", "minContains", "maxContains", "minProperties", "maxProperties",
    "dependentRequired", "dependentSchemas", "dependencies", "propertyNames", "patternProperties",
    "unevaluatedItems", "unevaluatedProperties", "additionalItems", "if", "then", "else", "not",
    "$dynamicRef", "$recursiveRef",
}
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_TYPE_KEYWORDS = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "prefixItems", "minItems", "maxItems"},
    "string": {"pattern", "minLength", "maxLength", "format"},
    "integer": set(_BOUNDS),
    "number": set(_BOUNDS),
}

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


def regex_for_schema(
    schema: Any, whitespace: Optional[str] = COMPACT_WHITESPACE, any_depth: int = DEFAULT_DEPTH, loose: bool = False
) -> str:
    """A regex whose matches are exactly (a subset of) the JSON documents valid under
    `schema` (a dict or its JSON text). `any_depth`: how many levels of containers a
    free-form value may nest. Raises RadixflowError naming what is unsupported. `loose` (tool
    arguments, which have no other backend): a oneOf whose branches may overlap is enforced as anyOf,
    and a pattern beside minLength / maxLength keeps the pattern alone, where they are otherwise refused."""
    text = schema if isinstance(schema, str) else json.dumps(schema)
    try:
        check_depth(any_depth)
    except ValueError as e:
        raise GrammarError(str(e)) from None
    return _regex_for_text(text, whitespace or COMPACT_WHITESPACE, any_depth, loose)


@dataclass
class _Rules:
    """What the rewrite collects (placeholder -> our regex) and how it renders free-form JSON."""

    whitespace: str
    any_depth: int
    root: Any = None  # the whole schema, where a oneOf's $refs are followed
    loose: bool = False  # regex_for_schema's
    swaps: dict = field(default_factory=dict)

    def swap(self, regex: str) -> dict:
        return {"const": self.placeholder(regex)}

    def placeholder(self, regex: str) -> str:
        """A name that stands, quoted, for `regex` in the regex outlines-core builds."""
        name = _PLACEHOLDER.format(len(self.swaps))
        self.swaps[name] = regex
        return name


def _escaped_keys(node: dict, rules: _Rules) -> dict:
    """Property names that JSON writes escaped (a quote, a backslash, a control character) go in as placeholders for
    their escaped, quoted text: outlines-core writes names as they are, so `n"x` came out as `"n"x"` (invalid JSON,
    found by fuzzing tool parameters)."""
    props = node.get("properties")
    renames = {k: rules.placeholder(re.escape(json.dumps(k, ensure_ascii=False))) for k in props
               if json.dumps(k, ensure_ascii=False)[1:-1] != k}  # fmt: skip
    if not renames:
        return node
    out = {**node, "properties": {renames.get(k, k): v for k, v in props.items()}}
    if isinstance(node.get("required"), list):
        out["required"] = [renames.get(k, k) for k in node["required"]]
    return out


@functools.lru_cache(maxsize=256)
def _regex_for_text(text: str, whitespace: str, any_depth: int, loose: bool) -> str:
    schema = _parse(text)
    rules = _Rules(whitespace, any_depth, schema, loose)
    schema = _rewrite(schema, rules, "#")
    swaps = rules.swaps
    try:
        regex = build_regex_from_schema(json.dumps(schema), whitespace)
    except (ValueError, TypeError) as e:
        first = summary(str(e))
        raise GrammarError(f"unsupported JSON schema: {first}") from None
    for name, sub in swaps.items():
        rendered = f'"{name}"'
        if rendered not in regex:
            raise GrammarError(f"unsupported JSON schema: could not place the rule for {name}")
        regex = regex.replace(rendered, f"(?:{sub})")
    return regex


def _parse(text: str) -> dict:
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise GrammarError(f"json_schema is not valid JSON: {e}") from None
    if not isinstance(schema, dict):
        raise GrammarError("json_schema must be a JSON object (a schema), e.g. {\"type\": \"object\", ...}")
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
        raise GrammarError(f"invalid JSON schema at {path}: {e.message}") from None


def _rewrite(node: Any, rules: _Rules, path: str) -> Any:
    """A copy of the schema with our own rules swapped in as placeholders."""
    if node is True:
        return rules.swap(any_value_regex(rules.any_depth, rules.whitespace))
    if not isinstance(node, dict):
        return node
    unenforced = sorted(set(node) & _VALIDATION - _SUPPORTED)
    if unenforced:
        keyword = unenforced[0]
        raise GrammarError(
            f"unsupported JSON schema: keyword '{keyword}' at {path[1:]}/{keyword} cannot be enforced by the outlines "
            "grammar backend; remove it or use --grammar-backend llguidance",
            keyword=keyword,
            pointer=f"{path[1:]}/{keyword}",
        )
    node = {k: v for k, v in node.items() if k in _SUPPORTED}  # unknown keywords are annotations
    if isinstance(node.get("pattern"), str):
        node["pattern"] = ecma_regex(node["pattern"])
    if len(node.get("allOf", [])) > 1:
        raise GrammarError(f"allOf with several subschemas at {path} is not supported; merge them into one")
    if isinstance(node.get("oneOf"), list) and not rules.loose:
        check_one_of(node["oneOf"], rules.root, path)
    if "pattern" in node and rules.loose:
        node = {k: v for k, v in node.items() if k not in ("minLength", "maxLength")}
    if "pattern" in node and ("minLength" in node or "maxLength" in node):  # outlines-core would drop the pattern
        raise GrammarError(f"pattern with minLength/maxLength at {path} is not supported by the regex conversion; put the "
                           "length into the pattern (e.g. ^[a-z]{1,10}$) or use --grammar-backend llguidance")
    if "enum" in node or "const" in node:
        node = _typed_enum(node, path)
    node = _complete_items(_complete_required(_split_typed_bounds(node), path))
    _check_item_counts(node, path)
    own = _own_regex(node, path) or _free_form_regex(node, rules)
    if own is not None:
        return rules.swap(own)
    out = dict(node)
    for key in _SUBSCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            out[key] = {k: _rewrite(v, rules, f"{path}/{key}/{k}") for k, v in node[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(node.get(key), list):
            out[key] = [_rewrite(v, rules, f"{path}/{key}/{i}") for i, v in enumerate(node[key])]
    if "properties" in node and node.get("additionalProperties", False) is not False:
        del out["additionalProperties"]  # outlines-core ignores it beside properties: only listed keys
    if isinstance(out.get("properties"), dict):
        out = _escaped_keys(out, rules)
    for key in ("items", "additionalProperties"):
        if key in out and (isinstance(node[key], dict) or node[key] is True):
            out[key] = _rewrite(node[key], rules, f"{path}/{key}")
    return out


_JSON_TYPES = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer(),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}


def _typed_enum(node: dict, path: str) -> dict:
    """enum / const beside other keywords: outlines-core renders the values alone, so the
    values are filtered by `type` here, and any other validation keyword beside them
    refuses the schema (it would not be checked)."""
    others = sorted(set(node) & _VALIDATION - {"enum", "const", "type"})
    if others:
        raise GrammarError(
            f"unsupported JSON schema: keyword '{others[0]}' beside enum/const at {path[1:]} cannot be enforced by "
            "the outlines grammar backend; use --grammar-backend llguidance",
            keyword=others[0],
            pointer=f"{path[1:]}/{others[0]}",
        )
    values = list(node["enum"]) if isinstance(node.get("enum"), list) else []
    if "const" in node:
        values = [v for v in values if v == node["const"]] if "enum" in node else [node["const"]]
    types = node.get("type")
    if types is not None:
        types = types if isinstance(types, list) else [types]
        values = [v for v in values if any(_JSON_TYPES.get(t, lambda _: False)(v) for t in types)]
    if not values:
        raise GrammarError(f"unsatisfiable JSON schema: no value of enum/const at {path[1:] or '(root)'} has its type")
    rest = {k: v for k, v in node.items() if k not in ("enum", "const", "type")}
    return {**rest, "enum": values}


def _split_typed_bounds(node: dict) -> dict:
    """{"type": ["integer", "null"], "minimum": 0} -> anyOf of one node per type; also
    type lists with "object" or "array" (so a free-form branch gets our regex)."""
    types = node.get("type")
    if not isinstance(types, list):
        return node
    if not any(k in node for k in _BOUNDS + ("format",)) and not {"object", "array"} & set(types):
        return node
    return {"anyOf": [_typed_branch(node, t) for t in types]}


def _typed_branch(node: dict, kind: str) -> dict:
    """`node` for one of its types, without the keywords of the others (outlines-core
    would render `{"type": "null", "properties": ...}` as an object)."""
    foreign = set().union(*(keys for t, keys in _TYPE_KEYWORDS.items() if t != kind)) - _TYPE_KEYWORDS.get(kind, set())
    return {**{k: v for k, v in node.items() if k != "type" and k not in foreign}, "type": kind}


def _complete_required(node: dict, path: str) -> dict:
    """Required keys missing from `properties` are added to it (with the
    additionalProperties schema, or any value): outlines-core emits only listed keys."""
    required = node.get("required") or []
    props = node.get("properties") or {}
    missing = [k for k in required if k not in props]
    if not missing:
        return node
    extra = node.get("additionalProperties", True)
    if extra is False:
        raise GrammarError(
            f"required key(s) {', '.join(missing)} at {path} are not in properties and additionalProperties "
            "is false: no object satisfies this schema"
        )
    return {**node, "properties": {**props, **{k: extra for k in missing}}}


def _complete_items(node: dict) -> dict:
    """An array with bounds but no items: items are any value (ours, not outlines-core's)."""
    if node.get("type") == "array" and "items" not in node and "prefixItems" not in node and set(node) - _ANNOTATIONS != {"type"}:
        return {**node, "items": True}
    return node


def _check_item_counts(node: dict, path: str) -> None:
    """Item counts outlines-core would not keep: it writes exactly the prefixItems, whatever minItems / maxItems say
    (fuzzing, session 29: [100] for minItems 3, [1,false] for maxItems 1)."""
    lo, hi, prefix = node.get("minItems", 0), node.get("maxItems"), node.get("prefixItems")
    if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
        raise GrammarError(f"unsatisfiable JSON schema: minItems ({lo}) is greater than maxItems ({hi}) at {path[1:] or '(root)'}")
    if isinstance(prefix, list) and ((isinstance(lo, int) and lo > len(prefix)) or (isinstance(hi, int) and hi < len(prefix))):
        raise GrammarError(f"prefixItems at {path[1:] or '(root)'} with minItems / maxItems that rule out an array of exactly "
                           f"its {len(prefix)} items is not supported by the outlines grammar backend (it writes exactly the "
                           "prefix items); use --grammar-backend llguidance")  # fmt: skip


def _free_form_regex(node: dict, rules: _Rules) -> Optional[str]:
    """Our depth-limited regex for a node that allows any value / object / array."""
    if node.get("type") == "array" and node.get("maxItems") == 0:  # outlines-core writes "[]" without its items
        return rf"\[{rules.whitespace}\]"
    keys = set(node) - _ANNOTATIONS
    if not keys:
        return any_value_regex(rules.any_depth, rules.whitespace)
    kind = node.get("type")
    if kind == "object" and keys <= {"type", "additionalProperties"} and _is_any(node.get("additionalProperties", True)):
        return any_object_regex(rules.any_depth, rules.whitespace)
    if kind == "object" and keys <= {"type", "additionalProperties", "properties"} and node.get("additionalProperties") is False and not node.get("properties"):
        return rf"\{{{rules.whitespace}\}}"
    if kind == "array" and keys <= {"type", "items", "minItems", "maxItems"} and _is_any(node.get("items", True)):
        return any_array_regex(rules.any_depth, rules.whitespace, node.get("minItems", 0), node.get("maxItems"))
    return None


def _is_any(schema: Any) -> bool:
    return schema is True or (isinstance(schema, dict) and not set(schema) - _ANNOTATIONS)


def _own_regex(node: dict, path: str) -> Optional[str]:
    if "enum" in node or "const" in node:
        return None
    kind = node.get("type")
    if kind in ("integer", "number") and any(k in node for k in _BOUNDS):
        return _bounded_number(node, kind == "integer", path)
    fmt = node.get("format")
    if kind == "string" and fmt is not None and fmt not in _FORMATS and fmt not in _OUTLINES_FORMATS:
        known = ", ".join(sorted(set(_FORMATS) | set(_OUTLINES_FORMATS)))
        raise GrammarError(f"string format {fmt!r} at {path} is not supported; use one of {known} or a pattern")
    if kind == "string" and fmt in _FORMATS:
        if any(k in node for k in ("pattern", "minLength", "maxLength")):
            raise GrammarError(f"format {node['format']} with pattern/minLength/maxLength at {path} is not supported")
        return _FORMATS[node["format"]]
    return None


def _bounded_number(node: dict, integer: bool, path: str) -> str:
    vals = [node.get(k) for k in _BOUNDS]
    if any(isinstance(v, bool) for v in vals):
        raise GrammarError(f"boolean exclusiveMinimum/exclusiveMaximum (draft 4) at {path}: use numbers")
    lo, hi, elo, ehi = vals
    if integer:
        return int_range_regex(*integer_bounds(lo, hi, elo, ehi))
    return number_range_regex(lo, hi, elo, ehi)

