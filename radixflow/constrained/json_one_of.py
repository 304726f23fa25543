"""oneOf in the regex conversion: a regex says "any of these", not "exactly one of these", so outlines-core
renders oneOf as anyOf. A oneOf is kept only where no value can match two of its branches, as far as their types,
their const / enum values, or a required property with different const / enum values (a discriminator) show;
otherwise it is refused (fuzzing found {"oneOf": [{"type": "integer"}, {"type": "number"}]} giving 1000)."""

from __future__ import annotations

from itertools import combinations
from typing import Any, Optional

from radixflow.errors import GrammarError


def check_one_of(branches: list, root: Any, path: str) -> None:
    """Raise GrammarError unless the branches of the oneOf at `path` are pairwise exclusive."""
    nodes = [_resolve(b, root) for b in branches]
    for i, j in combinations(range(len(nodes)), 2):
        if not _exclusive(nodes[i], nodes[j]):
            raise GrammarError(
                f"oneOf at {path}: branches {i} and {j} may both match one value, and the regex conversion can only "
                "enforce anyOf; make the branches exclusive (different types, different const / enum values, or a "
                "required property with different const values), or use anyOf",
                keyword="oneOf", pointer=f"{path[1:]}/oneOf",
            )  # fmt: skip


def _resolve(node: Any, root: Any, hops: int = 8) -> Any:
    """A local $ref ("#/$defs/X") followed to its schema (None where it cannot be)."""
    while isinstance(node, dict) and isinstance(node.get("$ref"), str) and hops > 0:
        ref, node, hops = node["$ref"], root, hops - 1
        if not ref.startswith("#"):
            return None
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) and "$ref" not in node else None


def _exclusive(a: Any, b: Any) -> bool:
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    ta, tb = _types(a), _types(b)
    if ta is not None and tb is not None and not _types_meet(ta, tb):
        return True
    ka, kb = _keys(a), _keys(b)
    if ka is not None and kb is not None:
        return _disjoint(ka, kb)
    if {"object"} not in (ta, tb):  # required / properties say nothing about values that are not objects
        return False
    common = set(_list(a.get("required"))) & set(_list(b.get("required")))
    return any(_disjoint(_keys(_prop(a, p)), _keys(_prop(b, p))) for p in common)


def _disjoint(ka: Optional[set], kb: Optional[set]) -> bool:
    return ka is not None and kb is not None and not ka & kb


def _keys(node: Any) -> Optional[set]:
    """The identities of a node's const / enum values (None: it has neither)."""
    values = _values(node) if isinstance(node, dict) else None
    return None if values is None else {_key(v) for v in values}


def _prop(node: dict, name: str) -> Any:
    props = node.get("properties")
    return props.get(name) if isinstance(props, dict) else None


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _values(node: dict) -> Optional[list]:
    if "const" in node:
        return [node["const"]]
    return node["enum"] if isinstance(node.get("enum"), list) else None


def _types(node: dict) -> Optional[set]:
    values = _values(node)
    if values is not None:
        return {_type_of(v) for v in values}
    kind = node.get("type")
    if isinstance(kind, str):
        return {kind}
    return set(kind) if isinstance(kind, list) and all(isinstance(k, str) for k in kind) else None


def _types_meet(a: set, b: set) -> bool:
    """Whether a value can have one of the types in `a` and one in `b` ("fraction": a const's non-integer number)."""
    def widened(t: set) -> set:
        return t | {"integer", "fraction"} if "number" in t else t
    return bool(widened(a) & widened(b))


def _type_of(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int) or isinstance(v, float) and v.is_integer():
        return "integer"
    names = {float: "fraction", str: "string", dict: "object", list: "array", type(None): "null"}
    return names.get(type(v), "unknown")


def _key(v: Any) -> Any:
    """A value's identity as JSON Schema compares them (1 == 1.0, true != 1)."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return (type(v).__name__, v)
    if isinstance(v, (int, float)):
        return ("number", float(v))
    if isinstance(v, list):
        return ("array", tuple(_key(x) for x in v))
    if isinstance(v, dict):
        return ("object", tuple(sorted((k, _key(x)) for k, x in v.items())))
    return ("other", repr(v))
