"""JSON schemas and regexes for the constrained-decoding tests and benchmark."""

from __future__ import annotations

_STR = {"type": "string"}
_ADDRESS = {
    "type": "object",
    "properties": {"street": _STR, "city": _STR, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
    "required": ["street", "city", "zip"],
}

SCHEMAS: list[dict] = [
    # flat objects, required and optional fields
    {"type": "object", "properties": {"name": _STR, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"]},
    {"type": "object", "properties": {"title": _STR, "year": {"type": "integer", "minimum": 1900, "maximum": 2030}, "rating": {"type": "number", "minimum": 0, "maximum": 10}}, "required": ["title", "year", "rating"]},
    {"type": "object", "properties": {"nickname": _STR, "email": {"type": "string", "format": "email"}}},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}, "c": _STR}, "required": ["b"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": ["string", "null"]}}, "required": ["ok", "note"]},
    # nested objects
    {"type": "object", "properties": {"name": _STR, "address": _ADDRESS}, "required": ["name", "address"]},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1}, "profile": {"type": "object", "properties": {"bio": {"type": "string", "maxLength": 40}, "verified": {"type": "boolean"}}, "required": ["bio", "verified"]}}, "required": ["id", "profile"]}}, "required": ["user"]},
    # arrays with bounds
    {"type": "object", "properties": {"tags": {"type": "array", "items": _STR, "minItems": 1, "maxItems": 3}}, "required": ["tags"]},
    {"type": "object", "properties": {"scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100}, "minItems": 2, "maxItems": 4}}, "required": ["scores"]},
    {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"]}, "minItems": 2, "maxItems": 2},
    {"type": "object", "properties": {"matrix": {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": -9, "maximum": 9}, "minItems": 2, "maxItems": 2}, "minItems": 2, "maxItems": 2}}, "required": ["matrix"]},
    {"type": "array", "prefixItems": [_STR, {"type": "integer"}, {"type": "boolean"}]},
    {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
    # enums, consts, unions
    {"type": "object", "properties": {"status": {"enum": ["active", "inactive", "banned"]}, "level": {"enum": [1, 2, 3]}}, "required": ["status", "level"]},
    {"type": "object", "properties": {"kind": {"const": "circle"}, "radius": {"type": "number", "exclusiveMinimum": 0, "maximum": 100}}, "required": ["kind", "radius"]},
    {"anyOf": [{"type": "string", "maxLength": 12}, {"type": "integer", "minimum": 0, "maximum": 999}]},
    {"oneOf": [
        {"type": "object", "properties": {"type": {"const": "cat"}, "lives": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["type", "lives"]},
        {"type": "object", "properties": {"type": {"const": "dog"}, "good": {"type": "boolean"}}, "required": ["type", "good"]},
    ]},
    {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no", "maybe"]}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["answer", "confidence"]},
    # numbers and integers with bounds
    {"type": "integer", "minimum": -50, "maximum": 50},
    {"type": "number", "minimum": -1, "maximum": 1},
    {"type": "object", "properties": {"temp_c": {"type": "number", "minimum": -90, "maximum": 60}, "humidity": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100}}, "required": ["temp_c", "humidity"]},
    {"type": "object", "properties": {"price": {"type": "number", "minimum": 0}, "qty": {"type": "integer", "minimum": 1, "maximum": 1000}, "currency": {"enum": ["USD", "EUR", "JPY"]}}, "required": ["price", "qty", "currency"]},
    # string patterns, lengths and formats
    {"type": "object", "properties": {"phone": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{3}-[0-9]{4}$"}, "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"}}, "required": ["phone", "code"]},
    {"type": "object", "properties": {"username": {"type": "string", "minLength": 3, "maxLength": 12}}, "required": ["username"]},
    {"type": "object", "properties": {"birthday": {"type": "string", "format": "date"}, "id": {"type": "string", "format": "uuid"}}, "required": ["birthday", "id"]},
    {"type": "object", "properties": {"created": {"type": "string", "format": "date-time"}, "at": {"type": "string", "format": "time"}}, "required": ["created", "at"]},
    {"type": "object", "properties": {"host": {"type": "string", "format": "ipv4"}, "port": {"type": "integer", "minimum": 1, "maximum": 65535}}, "required": ["host", "port"]},
    {"type": "object", "properties": {"homepage": {"type": "string", "format": "uri"}, "contact": {"type": "string", "format": "email"}}, "required": ["homepage", "contact"]},
    # $ref / $defs
    {"$defs": {"item": {"type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}, "count": {"type": "integer", "minimum": 1, "maximum": 20}}, "required": ["sku", "count"]}},
     "type": "object", "properties": {"order": {"type": "integer", "minimum": 1}, "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 2}}, "required": ["order", "items"]},
    {"$defs": {"point": {"type": "object", "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90}, "lon": {"type": "number", "minimum": -180, "maximum": 180}}, "required": ["lat", "lon"]}},
     "type": "object", "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}}, "required": ["start", "end"]},
    {"definitions": {"name": {"type": "string", "maxLength": 20}}, "type": "object", "properties": {"first": {"$ref": "#/definitions/name"}, "last": {"$ref": "#/definitions/name"}}, "required": ["first", "last"]},
    # free-form and top-level scalars
    {"type": "object", "properties": {"counts": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9}}}, "required": ["counts"]},
    {"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$"},
    {"type": "boolean"},
]

# (name, regex): each also valid for Python's re.fullmatch
REGEXES: list[tuple[str, str]] = [
    ("date", r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"),
    ("date_unicode_digits", r"\d{4}-\d{2}-\d{2}"),
    ("time_hm", r"([01][0-9]|2[0-3]):[0-5][0-9]"),
    ("time_hms", r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"),
    ("time_12h", r"(1[0-2]|[1-9]):[0-5][0-9] (AM|PM)"),
    ("ipv4", r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"),
    ("email", r"[a-z0-9._]{1,20}@[a-z0-9]{1,15}\.(com|org|net)"),
    ("phone_us", r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"),
    ("phone_intl", r"\+[1-9][0-9]{7,12}"),
    ("uuid", r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"),
    ("identifier", r"[A-Za-z_][A-Za-z0-9_]*"),
    ("integer", r"-?(0|[1-9][0-9]*)"),
    ("decimal", r"-?[0-9]+\.[0-9]{2}"),
    ("scientific", r"[1-9]\.[0-9]{1,3}e[+-][0-9]{1,2}"),
    ("hex_color", r"#[0-9a-fA-F]{6}"),
    ("yes_no", r"(yes|no)"),
    ("zip", r"[0-9]{5}(-[0-9]{4})?"),
    ("semver", r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"),
    ("url", r"https?://[a-z]{2,12}\.(com|org|io)(/[a-z]{1,8}){0,3}"),
    ("mac", r"[0-9A-F]{2}(:[0-9A-F]{2}){5}"),
    ("int_list", r"\[([0-9]{1,3}(, [0-9]{1,3}){0,4})?\]"),
    ("sentence", r"[A-Z][a-z]{1,10}( [a-z]{1,10}){2,6}\."),
    ("key_values", r"([a-z]{1,6}=[0-9]{1,3};){1,3}"),
]
