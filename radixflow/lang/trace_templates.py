"""A program's request graph traced, lowered, checked and partly tokenized once, then filled in
with each call's text arguments (trace_cache.py says when that gives the call's own graph).

The template is traced with placeholders for the text parameters; each placeholder becomes a
marked text node (the mark cannot occur in a program's own text: the tracer refuses it), so the
template lowers, parses and is checked against the backend as any graph; the pieces of constant
text without a mark are tokenized once. A call replaces the marks with its values in the graph
(for the replay), the wire-format ops and the parsed ops, and tokenizes only the marked pieces.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from radixflow.errors import RadixflowError
from radixflow.lang.errors import NotTraceable
from radixflow.lang.graph_run import _jsonable, signature, trace_graph
from radixflow.lang.ir import ArgRef, Fork, Graph, Text
from radixflow.lang.lowering import lower
from radixflow.lang.placeholder import _PATTERN, MARK, Placeholder
from radixflow.lang.trace_cache import analyse, key
from radixflow.runtime.sampling_params import plain

MAX_TEMPLATES = 256  # a function's templates (distinct non-text arguments), least recently used dropped


@dataclass
class Template:
    graph: Graph  # text parameters as marked Text nodes
    program: dict  # the lowered ops, marks in their text
    ops: list  # the parsed ops (program_ops.Op), checked against `backend`
    pieces: dict  # (text, first) -> ids of the constant pieces without a mark
    backend: Any
    chat: Any  # the chat template it was lowered with


@dataclass
class Prepared:
    """One call's graph, program and what the backend needs to run it unchecked."""

    graph: Graph
    program: dict
    ops: list
    pieces: dict


def prepared(fn, b, arguments: dict, defaults: dict) -> Optional[Prepared]:
    """This call's graph from fn's template (made on first use), or None: not provably the same
    as tracing the call (the caller then traces it), or the backend cannot run checked ops."""
    a = analyse(fn.func) if getattr(b, "prepare_graphs", None) else None
    k = None if a is None else key(fn.func, a, arguments)
    params = signature(fn.func).parameters
    if k is None or not plain(defaults) or any(n not in arguments and params[n].default is params[n].empty
                                               for n in fn.arg_names):  # fmt: skip
        return None  # (a missing argument: the call's own trace says what it is)
    k = repr((k, defaults))
    t = fn.templates.pop(k, _NONE_YET)  # put back last: a dict's order is its recency (an LRU)
    if t is not _NONE_YET:
        fn.templates[k] = t
    if t is _NONE_YET or (t is not None and (t.backend is not b or t.chat is not b.chat_template())):
        while len(fn.templates) >= MAX_TEMPLATES:
            fn.templates.pop(next(iter(fn.templates)), None)  # the least recently used
        t = _template(fn, b, {n: Placeholder("arg", n) if n in a.text else v for n, v in arguments.items()}, defaults)
        if t is not False:  # a check error is the backend's: not kept
            fn.templates[k] = t
    if not t:
        return None
    try:
        return _fill(t, b, arguments, {n: v for n, v in arguments.items() if n in a.text})
    except KeyError:  # a mark naming no text argument (key() refuses marks elsewhere): trace the call
        return None


def _fill(t: Template, b, arguments: dict, values: dict) -> Prepared:
    fill = lambda text: _PATTERN.sub(lambda m: values[m.group(3)], text) if MARK in text else text  # noqa: E731
    graph = dataclasses.replace(t.graph, nodes=_fill_nodes(t.graph.nodes, fill),
                                args={n: _jsonable(v) for n, v in arguments.items()})
    program = {"ops": _fill_wire(t.program["ops"], fill)}
    ops = _fill_ops(t.ops, fill)
    return Prepared(graph, program, ops, b.constant_pieces(ops, known=t.pieces))


_NONE_YET = object()


def _template(fn, b, args: dict, defaults: dict) -> Union[Template, None, bool]:
    """The template, None if the program is not traceable, False if the backend refused it (the
    call's own trace and run say what the caller sees in both cases)."""
    try:
        traced = trace_graph(fn.func, args, fn.arg_names)
        graph = dataclasses.replace(traced, nodes=_fill_nodes(traced.nodes, None))
        program = lower(graph, b.chat_template(), defaults)
    except NotTraceable:
        return None
    try:
        ops = b.prepare_graphs([program])[0]
    except RadixflowError:
        return False
    pieces = {k: ids for k, ids in b.constant_pieces(ops).items() if MARK not in k[0]}
    return Template(graph, program, ops, pieces, b, b.chat_template())


def _fill_nodes(nodes: list, fill: Optional[Callable[[str], str]]) -> list:
    """fill None: each argument's placeholder -> its marked text; else marks -> values."""
    out = []
    for n in nodes:
        if fill is None and isinstance(n, ArgRef):
            n = Text(text=Placeholder("arg", n.name).text(), nid=n.nid)  # a plain str: lowering reads it
        elif fill is not None and isinstance(n, Text) and MARK in n.text:
            n = Text(text=fill(n.text), nid=n.nid)
        elif isinstance(n, Fork):
            n = Fork(branches=[_fill_nodes(b, fill) for b in n.branches], nid=n.nid)
        out.append(n)
    return out


def _fill_wire(ops: list, fill: Callable[[str], str]) -> list:
    out = []
    for o in ops:
        if o["op"] == "text" and MARK in o["text"]:
            o = {**o, "text": fill(o["text"])}
        elif o["op"] == "fork":
            o = {**o, "branches": [_fill_wire(b, fill) for b in o["branches"]]}
        out.append(o)
    return out


def _fill_ops(ops: list, fill: Callable[[str], str]) -> list:
    out = []
    for o in ops:
        if o.kind == "text" and MARK in o.text:
            o = dataclasses.replace(o, text=fill(o.text))
        elif o.kind == "fork":
            o = dataclasses.replace(o, branches=[_fill_ops(b, fill) for b in o.branches])
        out.append(o)
    return out
