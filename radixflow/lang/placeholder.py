"""Placeholders stand for values unknown while tracing: generated variables and, in
`trace()` without arguments, the program's arguments.

They may be concatenated into the program (`s += "A: " + s["x"]`, f-strings too);
anything that would need the actual value (`if`, `==`, `int()`, `.strip()`) raises
DataDependentError, and the program runs eagerly instead.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from radixflow.lang.errors import DataDependentError
from radixflow.lang.ir import ArgRef, ExprList, Text, VarRef, _items

# Brackets a placeholder's name in text: four random private-use characters per process, which no user text holds by
# chance (a bare "\x1f", the mark before, in an argument made every mode fail; found by fuzzing) and which case
# changes leave alone, so a placeholder's text altered by str methods still shows one of them
_NONCE = "".join(chr(0xE000 + secrets.randbelow(0x1900)) for _ in range(4))
MARK = "\x1f" + _NONCE + "\x1f"
_PATTERN = re.compile(re.escape(MARK) + r"(var|arg):(\d+):(.*?)" + re.escape(MARK), re.DOTALL)  # kind, version, name


class Placeholder:
    """`version`: which value of a variable it stands for (the tracer counts each gen / select / set of a name), so
    one read before the name was generated again is not taken for the new value."""

    __slots__ = ("_kind", "_name", "_version")

    def __init__(self, kind: str, name: str, version: int = 0):
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_version", version)

    def node(self):
        return VarRef(name=self._name, version=self._version) if self._kind == "var" else ArgRef(name=self._name)

    def text(self) -> str:
        """Its marked text, a plain str (what `split_text` turns back into the placeholder)."""
        return f"{MARK}{self._kind}:{self._version}:{self._name}{MARK}"

    def __str__(self) -> str:
        return MarkedText(self.text())

    def __format__(self, spec: str) -> str:
        if spec:
            self._fail(f"format spec {spec!r}")
        return str(self)

    def __add__(self, other: Any) -> ExprList:
        return ExprList([self.node()] + _items(other))

    def __radd__(self, other: Any) -> ExprList:
        return ExprList(_items(other) + [self.node()])

    def __repr__(self) -> str:  # f"{x!r}", "%r", str([x]): the value's repr, which only eager mode has
        self._fail("repr")

    def _fail(self, what: str):
        raise DataDependentError(f"the program uses the value of {self._kind} {self._name!r} in Python ({what})")

    def __getattr__(self, name: str):
        self._fail(f".{name}")

    def __setattr__(self, name: str, value: Any):
        self._fail(f"setting .{name}")


def _make_op(op: str):
    def method(self, *args, **kwargs):
        self._fail(op)

    method.__name__ = op
    return method


for _op in (
    "__bool__ __eq__ __ne__ __lt__ __le__ __gt__ __ge__ __hash__ __len__ __iter__ __contains__ "
    "__getitem__ __int__ __float__ __index__ __mul__ __rmul__ __mod__ __call__ __bytes__"
).split():
    setattr(Placeholder, _op, _make_op(_op))


class MarkedText(str):
    """str(placeholder): text that builds prompt text (`+`, f-strings, `"".join`, `%s`) but fails, as the placeholder
    does, where the program would use the value itself (`.strip()`, `len`, `==`, `int`, `in`): a plain str there
    made graph mode take a branch that eager mode does not (`if str(s["v"]).strip():`, fuzzing, session 29)."""

    __slots__ = ()

    def _fail(self, what: str):
        kind, _, name = _PATTERN.search(str.__str__(self)).groups()
        raise DataDependentError(f"the program uses the value of {kind} {name!r} in Python (str(...){what})")


def _make_text_op(op: str):
    def method(self, *args, **kwargs):
        self._fail(f".{op}()" if not op.startswith("__") else f" {op}")

    method.__name__ = op
    return method


for _op in [name for name in dir(str) if not name.startswith("_")] + (
    "__len__ __eq__ __ne__ __lt__ __le__ __gt__ __ge__ __hash__ __getitem__ __iter__ __contains__ __mul__ "
    "__rmul__ __mod__ __rmod__ __int__ __float__ __complex__ __index__ __repr__ __bool__"
).split():
    setattr(MarkedText, _op, _make_text_op(_op))


def plain_str(text: str) -> str:
    """`text` as a plain str (a MarkedText's own characters)."""
    return str.__str__(text)


def split_text(text: str) -> list:
    """A string that may hold placeholders (from f-strings) -> Text / VarRef / ArgRef nodes."""
    text = plain_str(text)
    if MARK not in text:
        return [Text(text=text)] if text else []
    nodes, pos = [], 0
    for m in _PATTERN.finditer(text):
        if m.start() > pos:
            nodes.append(Text(text=text[pos : m.start()]))
        kind, version, name = m.groups()
        nodes.append(VarRef(name=name, version=int(version)) if kind == "var" else ArgRef(name=name))
        pos = m.end()
    if pos < len(text):
        nodes.append(Text(text=text[pos:]))
    if any(isinstance(n, Text) and any(c in n.text for c in _NONCE) for n in nodes):
        raise DataDependentError("a traced placeholder was altered by Python string operations")
    return nodes

