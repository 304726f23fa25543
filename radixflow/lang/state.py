"""ProgramState: what a program's `s` is. The same class runs eagerly (an Interpreter
behind it), while tracing (a Recorder) and when holding a request graph's results."""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Any, AsyncIterator, Callable, Iterator, Optional

from radixflow.lang.errors import ProgramError
from radixflow.lang.ir import ExprList, Node, ScopeBegin, ScopeEnd
from radixflow.lang.placeholder import Placeholder, split_text
from radixflow.lang.primitives import assistant, system, user
from radixflow.runtime.async_threads import iterate_in_thread

JOIN_MODES = {"gather_variable": "gather", "gather": "gather", "concate_and_append": "concat", "concat": "concat"}


def to_nodes(expr: Any) -> list[Node]:
    """Whatever a program appends -> IR nodes (copies, so expressions can be reused)."""
    if isinstance(expr, ExprList):
        return [n for item in expr.items for n in to_nodes(item)]
    if isinstance(expr, Placeholder):
        return [expr.node()]
    if isinstance(expr, str):
        return split_text(expr)
    if isinstance(expr, Node):
        return [dataclasses.replace(expr)]
    if isinstance(expr, (int, float)) and not isinstance(expr, bool):
        return split_text(str(expr))
    raise TypeError(f"cannot append a {type(expr).__name__} to a program; use str, gen, select or a role")


class ProgramState:
    def __init__(self, executor, mode: str = "eager"):
        self.executor = executor
        self.mode = mode  # "eager", "graph" or "trace": how it ran
        self.thread: Optional[threading.Thread] = None
        self.ret_value: Any = None  # what the program function returned (SGLang's)
        self._copied_from: Optional["ForkGroup"] = None  # s.copy()'s one-branch fork, joined by `with`'s exit
        self._joined = False  # a fork branch whose fork was joined: appending to it is an error

    # -- appending ---------------------------------------------------------------------------
    def __iadd__(self, expr: Any) -> "ProgramState":
        if self._joined:  # eager mode dropped such text, a graph joined it: SGLang's client hangs
            raise ProgramError("this fork branch was already joined (forks.join(), or the end of its `with` block); "
                               "append to the parent state instead")
        for node in to_nodes(expr):
            self.executor.execute(node)
        return self

    def system(self, expr: Any = None):
        return self._role(system, expr)

    def user(self, expr: Any = None):
        return self._role(user, expr)

    def assistant(self, expr: Any = None):
        return self._role(assistant, expr)

    def _role(self, make: Callable, expr: Any):
        """`s.user("hi")` appends a turn; `with s.user(): ...` wraps a block in one."""
        if expr is not None:
            self += make(expr)
            return None
        begin, end = make().items
        return _Block(self, begin, end)

    def var_scope(self, name: str):
        """`with s.var_scope("x"): ...` stores the text appended inside as s["x"]."""
        return _Block(self, ScopeBegin(name=name), ScopeEnd(name=name))

    # -- variables ---------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        self.sync()
        return self.executor.get(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.executor.set(name, value)

    def __contains__(self, name: str) -> bool:
        self.sync()
        return self.executor.contains(name) if hasattr(self.executor, "contains") else name in self.executor.vars

    def get_var(self, name: str) -> Any:
        return self[name]

    def set_var(self, name: str, value: Any) -> None:
        self[name] = value

    def tool_calls(self, name: str) -> list:
        """The calls (ToolCall(name, arguments)) that rf.tool_call(name, ...) generated."""
        from radixflow.lang.tools import parse_tool_calls

        return parse_tool_calls(self[name])

    def get_meta_info(self, name: str) -> Optional[dict]:
        self._readable("get_meta_info()")
        return self.executor.metas.get(name)

    # -- reading -------------------------------------------------------------------------------
    def text(self) -> str:
        self._readable("text()")
        return self.executor.text

    def messages(self) -> list[dict]:
        self._readable("messages()")
        return list(self.executor.messages)

    def _readable(self, what: str) -> None:
        if hasattr(self.executor, "unknown"):
            self.executor.unknown(what)
        self.sync()

    def variables(self) -> dict:
        self._readable("variables()")
        return dict(self.executor.vars)

    def sync(self) -> "ProgramState":
        """Wait for a streaming run to end; raise its error if it failed."""
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join()
        log = getattr(self.executor, "log", None)
        if log is not None and log.error is not None:
            raise log.error
        return self

    def error(self) -> Optional[BaseException]:
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join()
        log = getattr(self.executor, "log", None)
        return None if log is None else log.error

    def text_iter(self, var_name: Optional[str] = None) -> Iterator[str]:
        """Text deltas as they are generated (all text, or one variable's; `var_name` as SGLang names it)."""
        if self.thread is None:  # not streaming: everything is there already
            self.sync()
            yield self.executor.vars.get(var_name, "") if var_name is not None else self.executor.text
            return
        yield from self.executor.log.iter(var_name)

    async def text_async_iter(self, var_name: Optional[str] = None, return_meta_data: bool = False) -> AsyncIterator[Any]:
        """text_iter for asyncio; with return_meta_data, (delta, meta_info) pairs, where a
        gen's meta_info carries that chunk's own output logprobs (as SGLang's)."""
        if self.thread is None:
            self.sync()
            text = self.executor.vars.get(var_name, "") if var_name is not None else self.executor.text
            yield (text, self.executor.metas.get(var_name)) if return_meta_data else text
            return
        async for item in iterate_in_thread(self.executor.log.iter(var_name, with_meta=return_meta_data)):
            yield item  # from the shared pool of async_threads: the loop's default executor has few threads

    # -- fork ------------------------------------------------------------------------------------
    def fork(self, size: int = 1, position_ids_offset: Optional[list] = None) -> "ForkGroup":
        """`size` copies of the state that go on independently. position_ids_offset: SGLang's
        argument, accepted and ignored as SGLang's interpreter ignores it (None or one int a branch)."""
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ProgramError(f"fork(size) needs an int size >= 1, got {size!r}")
        if position_ids_offset is not None and (
            not isinstance(position_ids_offset, list) or len(position_ids_offset) != size
            or not all(isinstance(p, int) and not isinstance(p, bool) for p in position_ids_offset)
        ):  # fmt: skip
            raise ProgramError(f"fork: position_ids_offset must be None or a list of {size} ints")
        kids, nid = self.executor.fork(size)
        return ForkGroup([ProgramState(k, self.mode) for k in kids], self, nid)

    def copy(self) -> "ProgramState":
        """One fork branch. As SGLang's, also a context manager: `with s.copy() as c:` joins it on exit."""
        group = self.fork(1)
        group[0]._copied_from = group
        return group[0]

    def __enter__(self) -> "ProgramState":
        if self._copied_from is None:
            raise ProgramError("only s.copy() is a context manager (`with s.copy() as c:`); for roles use "
                               "`with s.user():`, for branches `with s.fork(n) as forks:`")
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and not self._copied_from.joined:
            self._copied_from.join()

    def __repr__(self) -> str:
        if hasattr(self.executor, "unknown"):
            return "ProgramState(tracing)"
        return f"ProgramState(mode={self.mode}, text={self.executor.text[-60:]!r})"


class _Block:
    def __init__(self, state: ProgramState, begin: Node, end: Node):
        self.state, self.begin, self.end = state, begin, end

    def __enter__(self) -> ProgramState:
        self.state += self.begin
        return self.state

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.state += self.end


def _calls_model(expr: Any) -> bool:
    return any(n.kind in ("gen", "select") for n in to_nodes(expr))


def _each_on_a_thread(calls: list) -> None:
    """Run calls at once (eager fork branches: their gens then share the backend's batches, as a
    request graph's branches do); the first's error is raised once all have ended."""
    errors: list = [None] * len(calls)

    def run(i: int) -> None:
        try:
            calls[i]()
        except BaseException as e:  # raised on the caller's thread below
            errors[i] = e

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(1, len(calls))]
    for t in threads:
        t.start()
    run(0)
    for t in threads:
        t.join()
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first


class ForkGroup(list):
    """The states of a fork; `forks += expr` appends to each (a callable gets the index)."""

    def __init__(self, states: list, parent: ProgramState, nid: Optional[int]):
        super().__init__(states)
        self.parent, self.nid, self.joined = parent, nid, False

    def __iadd__(self, expr: Any) -> "ForkGroup":
        def branch_expr(i: int) -> Any:
            return expr(i) if callable(expr) else expr[i] if isinstance(expr, (list, tuple)) else expr

        if not self._concurrent():  # one after another: each expr is made just before its append
            for i, s in enumerate(self):
                s += branch_expr(i)
            return self
        exprs = [branch_expr(i) for i in range(len(self))]  # all first: the branches then run at once
        if any(_calls_model(e) for e in exprs):
            _each_on_a_thread([functools.partial(ProgramState.__iadd__, s, e) for s, e in zip(self, exprs)])
        else:
            for s, e in zip(self, exprs):
                s += e
        return self

    def _concurrent(self) -> bool:
        """Eager branches on a backend that batches calls from many threads run at once."""
        backend = getattr(self.parent.executor, "backend", None)
        return self.parent.mode == "eager" and len(self) > 1 and getattr(backend, "batches_threads", False)

    def join(self, mode: str = "gather_variable") -> None:
        """Each variable the branches set that the parent lacks becomes a list in the parent, of the values of the
        branches that set it (SGLang's join). gather_variable
        leaves the parent's text as it was; concate_and_append appends the branches'
        texts to it, in order (the first branch's KV is reused through the radix cache)."""
        if mode not in JOIN_MODES:
            raise ProgramError(f"join mode must be one of {', '.join(JOIN_MODES)}, got {mode!r}")
        if self.joined:
            raise ProgramError("these forks were already joined")
        self.joined = True
        for s in self:
            s._joined = True
        self.parent.executor.join([s.executor for s in self], JOIN_MODES[mode], self.nid)

    def __enter__(self) -> "ForkGroup":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and not self.joined:
            self.join()

