"""Tracing: runs a program against a recorder instead of a model. Generated values are
placeholders; if the program finishes, what it appended is a static request graph."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any, Optional

from radixflow.lang.errors import DataDependentError
from radixflow.lang.ir import Expr, Fork, Gen, Join, Node, ScopeEnd, Select, SeparateReasoning, SetVar, VarRef
from radixflow.lang.placeholder import MARK, Placeholder


class Recorder:
    """The executor behind a ProgramState while tracing."""

    def __init__(self, counter: Optional[itertools.count] = None, known: Optional[dict] = None):
        self.nodes: list[Node] = []
        self.counter = counter or itertools.count()
        self.known: dict = dict(known or {})  # name -> Placeholder (generated) or a value the program set
        self.produced: list = []

    def execute(self, node: Node) -> None:
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
        self.known[name] = Placeholder("var", name)
        self.produced.append(name)

    def get(self, name: str) -> Any:
        if name not in self.known:
            raise KeyError(f"the program has no variable {name!r} (yet)")
        return self.known[name]

    def set(self, name: str, value: Any) -> None:
        """`s[name] = value`: recorded (SetVar), so the graph's replay sets it as eager mode does (it was lost)."""
        ref = value._name if isinstance(value, Placeholder) and value._kind == "var" else None
        if ref is None:
            check_plain(f"variable {name!r}", value)
        self.known[name] = value
        self.nodes.append(SetVar(name=name, value=None if ref else value, ref=ref, nid=next(self.counter)))
        self.produced.append(name)

    def contains(self, name: str) -> bool:
        return name in self.known

    def unknown(self, what: str):
        raise DataDependentError(f"the program reads {what} while it is being traced")

    def fork(self, n: int) -> tuple[list["Recorder"], int]:
        kids = [Recorder(self.counter, self.known) for _ in range(n)]
        node = Fork(branches=[k.nodes for k in kids], nid=next(self.counter))
        self.nodes.append(node)
        return kids, node.nid

    def join(self, kids: list["Recorder"], mode: str, fork_nid: int) -> None:
        self.nodes.append(Join(fork=fork_nid, mode=mode, nid=next(self.counter)))
        for name in dict.fromkeys(n for k in kids for n in k.produced):
            self._produce(name)


def check_plain(what: str, value: Any) -> None:
    """DataDependentError for a value that holds a placeholder (an argument, text built from a generated value, a
    container of them): only its real value can be kept (a variable the program sets, its return value)."""
    if isinstance(value, (Placeholder, Expr)) or (isinstance(value, str) and MARK in value):  # Expr: s["a"] + "!"
        raise DataDependentError(f"{what} is set from a value unknown while tracing")
    repr(value)  # a container's repr reaches its items' (Placeholder.__repr__ raises)


def _check_no_placeholders(node: Node) -> None:
    for name in _field_names(type(node)):
        value = getattr(node, name)
        items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else [value]
        for v in items:
            if isinstance(v, Placeholder) or (isinstance(v, str) and MARK in v):
                raise DataDependentError(f"{node.kind} {getattr(node, 'name', '')!r} has a generated value in {name}")


@functools.lru_cache(maxsize=None)
def _field_names(cls: type) -> tuple:
    return tuple(f.name for f in dataclasses.fields(cls))
