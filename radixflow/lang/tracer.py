"""Tracing: runs a program against a recorder instead of a model. Generated values are
placeholders; if the program finishes, what it appended is a static request graph."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any, Callable, Optional

from radixflow.lang.errors import DataDependentError
from radixflow.lang.ir import Expr, Fork, Gen, Join, Node, ScopeEnd, Select, SeparateReasoning, SetVar, VarRef, _walk
from radixflow.lang.placeholder import MARK, Placeholder, plain_str
from radixflow.runtime.programs.program_ops import joined_names


class Recorder:
    """The executor behind a ProgramState while tracing."""

    def __init__(self, counter: Optional[itertools.count] = None, known: Optional[dict] = None,
                 versions: Optional[dict] = None):
        self.nodes: list[Node] = []
        self.counter = counter or itertools.count()
        self.known: dict = dict(known or {})  # name -> Placeholder (generated) or a value the program set
        self.versions: dict = dict(versions or {})  # name -> how often it was generated or set
        self.produced: list = []

    def execute(self, node: Node) -> None:
        if isinstance(node, VarRef) and node.version != self.versions.get(node.name, 0):
            raise DataDependentError(f"a value of variable {node.name!r} read before it was generated or set again")
        if isinstance(node, VarRef) and not isinstance(self.known.get(node.name, Placeholder("var", "")), Placeholder):
            from radixflow.lang.placeholder import split_text

            for n in split_text(str(self.known[node.name])):
                self.execute(n)
            return
        _check_no_placeholders(node)
        node.nid = next(self.counter)  # a node reaches here as a fresh copy (state.to_nodes, split_text)
        self.nodes.append(node)
        name = getattr(node, "name", None)
        if isinstance(node, (Gen, Select, ScopeEnd)) and name:
            self._produce(name)
        if isinstance(node, SeparateReasoning):
            self._produce(node.reasoning_var)

    def _produce(self, name: str) -> None:
        self.known[name] = Placeholder("var", name, self._new_version(name))
        self.produced.append(name)

    def _new_version(self, name: str) -> int:
        self.versions[name] = self.versions.get(name, 0) + 1
        return self.versions[name]

    def get(self, name: str) -> Any:
        if name not in self.known:
            raise KeyError(f"the program has no variable {name!r} (yet)")
        return self.known[name]

    def set(self, name: str, value: Any) -> None:
        """`s[name] = value`: recorded (SetVar), so the graph's replay sets it as eager mode does (it was lost). A
        value holding generated ones is the variable's own placeholder from here on: read back into the text it
        makes the program eager, where it could otherwise stand for a later value of the same name."""
        held = kept(f"variable {name!r}", value, self.versions)
        self.nodes.append(SetVar(name=name, value=value, versions=dict(self.versions), nid=next(self.counter)))
        version = self._new_version(name)
        self.known[name] = Placeholder("var", name, version) if held else value
        self.produced.append(name)

    def check_kept(self, ret: Any) -> Any:
        """After the trace: the values it keeps are still what its replay can give. A value set and changed
        afterwards (`s["l"] = []`, then `s["l"].append(...)`) is checked again where it was set, and the return value
        against the variables' final values. Then each is copied into the graph, its placeholders as VarRefs (to_ir);
        returns the return value's copy."""
        sets = [n for n in _walk(self.nodes) if isinstance(n, SetVar)]
        for n in sets:
            kept(f"variable {n.name!r}", n.value, n.versions)
        kept("the return value", ret, self.versions)
        for n in sets:
            n.value = to_ir(n.value)
        return to_ir(ret)

    def contains(self, name: str) -> bool:
        return name in self.known

    def unknown(self, what: str):
        raise DataDependentError(f"the program reads {what} while it is being traced")

    def fork(self, n: int) -> tuple[list["Recorder"], int]:
        kids = [Recorder(self.counter, self.known, self.versions) for _ in range(n)]
        node = Fork(branches=[k.nodes for k in kids], nid=next(self.counter))
        self.nodes.append(node)
        return kids, node.nid

    def join(self, kids: list["Recorder"], mode: str, fork_nid: int) -> None:
        self.nodes.append(Join(fork=fork_nid, mode=mode, nid=next(self.counter)))
        for name, _ in joined_names(self.known, kids):  # new branch variables become lists
            self._produce(name)


_CONTAINERS = (list, tuple, set, frozenset)


def kept(what: str, value: Any, versions: dict) -> bool:
    """Whether `value` holds generated variables' placeholders, which a graph's replay resolves (`resolve`): it is
    plain data (str, numbers, bools, None, and lists, tuples, sets, dicts of them) with such placeholders in it, each
    for its variable's value as of `versions` (where the replay resolves it). Any other value only eager mode has
    (text built from a generated value, an argument unknown while tracing, an object of the program's own, an
    earlier value of a variable generated again): DataDependentError."""
    if isinstance(value, Placeholder):
        if value._kind != "var":
            raise DataDependentError(f"{what} holds argument {value._name!r}, unknown while tracing")
        if value._version != versions.get(value._name, 0):
            raise DataDependentError(f"{what} holds a value of {value._name!r} from before it was generated again")
        return True
    if isinstance(value, str):
        if MARK in plain_str(value):
            raise DataDependentError(f"{what} is text built from a generated value")
        return False
    if value is None or type(value) in (bool, int, float):
        return False
    items = value if type(value) in _CONTAINERS else [*value, *value.values()] if type(value) is dict else None
    if items is None:
        raise DataDependentError(f"{what} is a {type(value).__name__}; a request graph keeps plain data only")
    return any([kept(what, v, versions) for v in items])


def to_ir(value: Any) -> Any:
    """A kept value in new containers, each placeholder as its VarRef: the graph holds IR, not the tracer's objects
    (sets and dict keys hold none: a placeholder has no hash)."""
    if isinstance(value, Placeholder):
        return value.node()
    if type(value) in _CONTAINERS:
        return type(value)(to_ir(v) for v in value)
    if type(value) is dict:
        return {k: to_ir(v) for k, v in value.items()}
    return value


def resolve(value: Any, get: Callable[[str], Any]) -> Any:
    """A graph's kept value (to_ir) with each VarRef replaced by its variable's value (`get`), in new containers (a
    graph's values are shared by the calls its template serves)."""
    if isinstance(value, VarRef):
        return get(value.name)
    if type(value) in _CONTAINERS:
        return type(value)(resolve(v, get) for v in value)
    if type(value) is dict:  # keys hold no variables (kept: a placeholder has no hash)
        return {k: resolve(v, get) for k, v in value.items()}
    return value


def _check_no_placeholders(node: Node) -> None:
    for name in _field_names(type(node)):
        value = getattr(node, name)
        items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else [value]
        for v in items:
            if isinstance(v, Placeholder) or (isinstance(v, str) and MARK in plain_str(v)):
                raise DataDependentError(f"{node.kind} {getattr(node, 'name', '')!r} has a generated value in {name}")


@functools.lru_cache(maxsize=None)
def _field_names(cls: type) -> tuple:
    return tuple(f.name for f in dataclasses.fields(cls))
