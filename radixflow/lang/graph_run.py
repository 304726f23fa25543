"""Trace a program into a Graph, and rebuild a ProgramState from a graph's results."""

from __future__ import annotations

import functools
import inspect
from typing import Callable

from radixflow.lang.backends.base import Backend
from radixflow.lang.chat_template import ChatTemplate
from radixflow.lang.errors import NotTraceable, raised_while_tracing
from radixflow.lang.interpreter import GenResult, Interpreter, SelectResult
from radixflow.lang.ir import Fork, Graph, Join, SetVar
from radixflow.lang.placeholder import Placeholder
from radixflow.lang.state import ProgramState
from radixflow.lang.stream_log import QuietLog
from radixflow.lang.tracer import Recorder, resolve


@functools.lru_cache(maxsize=1024)
def signature(func: Callable) -> inspect.Signature:
    """inspect.signature, once per function: run() needs it twice a call, each a walk of the
    function's code object in Python."""
    return inspect.signature(func)


def trace_graph(func: Callable, arguments: dict, arg_names: list) -> Graph:
    params = signature(func).parameters
    args = dict(arguments)
    for name in arg_names:
        if name not in args and params[name].default is inspect.Parameter.empty:
            args[name] = Placeholder("arg", name)
    rec, ret = Recorder(), []
    state = ProgramState(rec, "trace")
    try:
        caught = raised_while_tracing(lambda: ret.append(func(state, **args)))
        kept_ret = rec.check_kept(None if ret[0] is state else ret[0])  # values built from generated ones: eager's
    except NotTraceable:
        raise
    except Exception as e:  # e.g. a placeholder reached code that needs a real value
        raise NotTraceable(f"tracing {func.__name__} raised {type(e).__name__}: {e}") from e
    if caught:  # `try: int(s["n"]) except Exception: ...` took its fallback branch on the placeholder
        raise NotTraceable(f"{func.__name__} caught an exception raised by a value unknown while tracing")
    own = ret[0] is state
    return Graph(func.__name__, rec.nodes, {k: _jsonable(v) for k, v in args.items()}, kept_ret, own)


def _jsonable(v):
    if isinstance(v, Placeholder):
        return None
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    return repr(v)


class ReplayBackend(Backend):
    """Answers gen/select from a request graph's results, by node id."""

    def __init__(self, results: dict):
        self.results = results

    def _get(self, node) -> dict:
        return self.results[str(node.nid)]

    def generate(self, prompt, params, node=None):
        r = self._get(node)
        if isinstance(r["text"], list):  # n > 1: one result per sample
            return [GenResult(t, None, m) for t, m in zip(r["text"], r["meta_info"])]
        return GenResult(r["text"], None, r.get("meta_info"))

    def select(self, prompt, choices, method, node=None) -> SelectResult:
        r = self._get(node)
        return SelectResult(choices.index(r["text"]), None, r.get("meta_info"))


def replay(graph: Graph, out: dict, template: ChatTemplate, defaults: dict) -> ProgramState:
    ex = Interpreter(ReplayBackend(out["results"]), defaults, template, use_ids=False, log=QuietLog())
    _replay(ex, graph.nodes, {})
    state = ProgramState(ex, "graph")
    state.ret_value = state if graph.ret_state else resolve(graph.ret, ex.get)
    return state


def _replay(ex: Interpreter, nodes: list, forks: dict) -> None:
    for n in nodes:
        if isinstance(n, Fork):
            kids, _ = ex.fork(len(n.branches))
            forks[n.nid] = kids
            for kid, branch in zip(kids, n.branches):
                _replay(kid, branch, forks)
        elif isinstance(n, Join):
            ex.join(forks[n.fork], n.mode)
        elif isinstance(n, SetVar):
            ex.set(n.name, resolve(n.value, ex.get))
        else:
            ex.execute(n)
