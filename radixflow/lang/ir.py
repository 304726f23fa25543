"""Program IR: the nodes a program appends to its state, and the traced graph.

Expressions (`"Q: " + rf.gen("a")`) are concatenations of nodes; a traced program is a
`Graph`: a list of nodes, where a `Fork` node holds one node list per branch. Every node
is a dataclass with a `kind`; `Graph.to_json()` / `Graph.from_json()` round-trip it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Optional, Union


class Expr:
    """Anything that can be appended to a program state; `+` concatenates."""

    def __add__(self, other: Any) -> "ExprList":
        return ExprList(_items(self) + _items(other))

    def __radd__(self, other: Any) -> "ExprList":
        return ExprList(_items(other) + _items(self))


@dataclass
class ExprList(Expr):
    items: list = field(default_factory=list)


def _items(x: Any) -> list:
    if isinstance(x, ExprList):
        return list(x.items)
    return [x]


@dataclass
class Node(Expr):
    kind = "node"
    nid: int = field(default=-1, kw_only=True)


@dataclass
class Text(Node):
    kind = "text"
    text: str = ""


@dataclass
class ArgRef(Node):
    """A program argument not given to trace(): a placeholder in the graph."""

    kind = "arg"
    name: str = ""


@dataclass
class VarRef(Node):
    """The value of a variable set earlier (by gen, select, var_scope or join)."""

    kind = "var"
    name: str = ""
    version: int = 0  # which value of it (tracer: Placeholder's version); the runtime reads its latest


@dataclass
class Gen(Node):
    kind = "gen"
    name: Optional[str] = None
    params: dict = field(default_factory=dict)  # only the fields the program set


@dataclass
class Select(Node):
    kind = "select"
    name: Optional[str] = None
    choices: list = field(default_factory=list)
    method: str = "token_length_normalized"
    temperature: float = 0.0


@dataclass
class RoleBegin(Node):
    kind = "role_begin"
    role: str = "user"


@dataclass
class RoleEnd(Node):
    kind = "role_end"
    role: str = "user"


@dataclass
class ScopeBegin(Node):
    kind = "scope_begin"
    name: str = ""


@dataclass
class ScopeEnd(Node):
    kind = "scope_end"
    name: str = ""


@dataclass
class Fork(Node):
    kind = "fork"
    branches: list = field(default_factory=list)  # list[list[Node]]


@dataclass
class Join(Node):
    kind = "join"
    fork: int = -1
    mode: str = "gather"


@dataclass
class SeparateReasoning(Node):
    """After gen / select `name`: its thinking goes to `<name>_reasoning_content`, the variable and
    the program's text keep the answer (runtime/reasoning.py splits it; model_type names the format)."""

    kind = "separate_reasoning"
    name: str = ""
    model_type: str = ""

    @property
    def reasoning_var(self) -> str:
        return reasoning_var(self.name)


@dataclass
class SetVar(Node):
    """`s[name] = value` from Python: no request, the replay of the graph's results sets it. `value` is plain data
    in which generated variables may stand as placeholders (tracer.kept), resolved then (tracer.resolve)."""

    kind = "set_var"
    name: str = ""
    value: Any = field(default=None, repr=False)  # placeholders while tracing, VarRefs in the traced graph
    versions: dict = field(default_factory=dict, repr=False)  # each variable's version where it was set


def reasoning_var(name: str) -> str:
    return f"{name}_reasoning_content"


NODE_TYPES = {c.kind: c for c in (Text, ArgRef, VarRef, Gen, Select, RoleBegin, RoleEnd, ScopeBegin, ScopeEnd, Fork, Join,
                                  SeparateReasoning, SetVar)}  # fmt: skip


def value_to_json(value: Any) -> Any:
    """A kept value (a SetVar's, a graph's return value: plain data, generated variables as VarRefs) as JSON: a VarRef
    becomes {"$var": name, "version": n}; tuples, sets and dicts with keys other than plain strings are tagged."""
    if isinstance(value, VarRef):
        return {"$var": value.name, "version": value.version}
    if type(value) is list:
        return [value_to_json(v) for v in value]
    if type(value) in (tuple, set, frozenset):
        return {"$" + type(value).__name__: [value_to_json(v) for v in value]}
    if type(value) is dict:
        if all(type(k) is str and not k.startswith("$") for k in value):
            return {k: value_to_json(v) for k, v in value.items()}
        return {"$dict": [[value_to_json(k), value_to_json(v)] for k, v in value.items()]}
    return value


def value_from_json(value: Any) -> Any:
    """value_to_json's inverse."""
    if type(value) is list:
        return [value_from_json(v) for v in value]
    if type(value) is not dict:
        return value
    if "$var" in value:
        return VarRef(name=value["$var"], version=value["version"])
    for tag, make in (("$tuple", tuple), ("$set", set), ("$frozenset", frozenset)):
        if tag in value:
            return make(value_from_json(v) for v in value[tag])
    if "$dict" in value:
        return {value_from_json(k): value_from_json(v) for k, v in value["$dict"]}
    return {k: value_from_json(v) for k, v in value.items()}


def node_to_dict(node: Node) -> dict:
    d = {"kind": node.kind}
    for f in dataclasses.fields(node):
        v = getattr(node, f.name)
        d[f.name] = [[node_to_dict(n) for n in b] for b in v] if f.name == "branches" else v
    if isinstance(node, SetVar):
        d["value"] = value_to_json(node.value)
    return d


def node_from_dict(d: dict) -> Node:
    d = dict(d)
    cls = NODE_TYPES[d.pop("kind")]
    if "branches" in d:
        d["branches"] = [[node_from_dict(n) for n in b] for b in d["branches"]]
    if cls is SetVar:
        d["value"] = value_from_json(d.get("value"))
    return cls(**d)


@dataclass
class Graph:
    """A traced program: its nodes in order, and the arguments it was traced with."""

    name: str
    nodes: list
    args: dict = field(default_factory=dict)
    ret: Any = field(default=None, repr=False)  # what the function returned (SGLang's state.ret_value), as SetVar's value
    ret_state: bool = False  # ... or the state itself (`return s`)

    def to_json(self) -> dict:
        """Plain JSON (json.dumps takes it), also where a set or returned value holds generated variables."""
        return {"name": self.name, "args": self.args, "nodes": [node_to_dict(n) for n in self.nodes],
                "ret": value_to_json(self.ret), "ret_state": self.ret_state}  # fmt: skip

    @classmethod
    def from_json(cls, d: Union[dict, str]) -> "Graph":
        if isinstance(d, str):
            d = json.loads(d)
        return cls(d["name"], [node_from_dict(n) for n in d["nodes"]], d.get("args", {}), value_from_json(d.get("ret")),
                   d.get("ret_state", False))

    def walk(self):
        yield from _walk(self.nodes)

    @property
    def variables(self) -> list[str]:
        names = [getattr(n, "name", None) for n in self.walk() if n.kind in ("gen", "select", "scope_end")]
        names += [n.reasoning_var for n in self.walk() if isinstance(n, SeparateReasoning)]
        return list(dict.fromkeys(n for n in names if n))

    def __str__(self) -> str:
        lines = [f"program {self.name}({', '.join(self.args)})"]
        _print(self.nodes, lines, "  ")
        return "\n".join(lines)

    def print(self) -> None:
        print(str(self))


def _walk(nodes: list):
    for n in nodes:
        yield n
        if isinstance(n, Fork):
            for b in n.branches:
                yield from _walk(b)


def _print(nodes: list, lines: list, indent: str) -> None:
    for n in nodes:
        lines.append(f"{indent}%{n.nid} {_describe(n)}")
        if isinstance(n, Fork):
            for i, b in enumerate(n.branches):
                lines.append(f"{indent}  branch {i}:")
                _print(b, lines, indent + "    ")


def _describe(n: Node) -> str:
    if isinstance(n, Text):
        return f"text {n.text!r}"
    if isinstance(n, (ArgRef, VarRef)):
        return f"{n.kind} {n.name}"
    if isinstance(n, Gen):
        params = " ".join(f"{k}={v!r}" for k, v in n.params.items())
        return f"gen {n.name} {params}".rstrip()
    if isinstance(n, Select):
        return f"select {n.name} {n.choices!r} method={n.method}"
    if isinstance(n, (RoleBegin, RoleEnd)):
        return f"{n.kind} {n.role}"
    if isinstance(n, (ScopeBegin, ScopeEnd)):
        return f"{n.kind} {n.name}"
    if isinstance(n, Fork):
        return f"fork x{len(n.branches)}"
    if isinstance(n, Join):
        return f"join %{n.fork} mode={n.mode}"
    if isinstance(n, SeparateReasoning):
        return f"separate_reasoning {n.name} model_type={n.model_type}"
    if isinstance(n, SetVar):
        return f"set_var {n.name}"
    return n.kind
