"""`@rf.function`: a Python function over a program state `s`, run on a backend.

run() first traces the program with its arguments. If the trace completes (no
generated value was used in Python), the program is a static request graph and runs as
one submission inside the runtime; otherwise it runs eagerly, one call per gen.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Optional, Union

from radixflow.errors import RadixflowError, ServerBusyError
from radixflow.lang.backends import resolve_backend
from radixflow.lang.errors import GenerationError, NotTraceable
from radixflow.lang.graph_run import replay, signature, trace_graph
from radixflow.lang.interpreter import Interpreter
from radixflow.lang.ir import Graph
from radixflow.lang.lowering import constant_prefix, lower
from radixflow.lang.primitives import LOGPROB_KEYS
from radixflow.lang.speculation import Speculation
from radixflow.lang.state import ProgramState
from radixflow.lang.trace_templates import prepared
from radixflow.runtime.async_threads import in_thread
from radixflow.runtime.programs.program_meta import metas
from radixflow.runtime.sampling_params import RUN_SAMPLING_PARAMS, SAMPLING_DEFAULTS

MIN_CACHED_PREFIX = 65  # characters: SGLang caches a program's prefix only when it is longer than 64

MODES = ("auto", "graph", "eager")


def _makes_requests(ops: list) -> bool:
    return any(op.get("op") in ("gen", "select") or (op.get("op") == "fork" and any(map(_makes_requests, op["branches"])))
               for op in ops)  # fmt: skip


class Function:
    def __init__(self, func: Callable, bound: Optional[dict] = None, num_api_spec_tokens: Optional[int] = None):
        self.func = func
        self.bound = dict(bound or {})
        if num_api_spec_tokens is not None and (not isinstance(num_api_spec_tokens, int) or num_api_spec_tokens < 1):
            raise RadixflowError(f"@function {func.__name__}: num_api_spec_tokens must be a positive int, got {num_api_spec_tokens!r}")
        self.num_api_spec_tokens = num_api_spec_tokens
        params = list(inspect.signature(func).parameters)
        if not params or params[0] != "s":
            raise RadixflowError(f"@function {func.__name__}: the first parameter must be named s")
        self.arg_names = params[1:]
        self.templates: dict = {}  # trace_templates.py: key -> Template (None: not reusable for that key)
        functools.update_wrapper(self, func)

    def bind(self, **kwargs: Any) -> "Function":
        return Function(self.func, {**self.bound, **kwargs}, self.num_api_spec_tokens)

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramState:
        return self.run(*args, **kwargs)

    # -- arguments ---------------------------------------------------------------------------
    def _split(self, args: tuple, kwargs: dict) -> tuple[dict, dict]:
        """(program arguments, sampling defaults)."""
        run_params = RUN_SAMPLING_PARAMS + LOGPROB_KEYS  # SGLang's run() takes both for every gen
        sampling = {k: kwargs.pop(k) for k in run_params if k in kwargs and k not in self.arg_names}
        sampling = {k: v for k, v in sampling.items() if v is not None}
        bound = signature(self.func).bind_partial(None, *args, **{**self.bound, **kwargs})
        arguments = dict(bound.arguments)
        arguments.pop("s")
        return arguments, {"max_new_tokens": SAMPLING_DEFAULTS["max_new_tokens"], **sampling}

    # -- tracing -------------------------------------------------------------------------------
    def trace(self, *args: Any, **kwargs: Any) -> Graph:
        """The request graph (missing arguments become placeholders). Raises NotTraceable
        if the program uses a generated value in Python."""
        arguments, _ = self._split(args, kwargs)
        return trace_graph(self.func, arguments, self.arg_names)

    def cache(self, backend: Any = None) -> bool:
        """SGLang's f.cache(): prefill the program's constant prefix (its text and role markers before the first
        argument, gen, select or fork; arguments with defaults take them, as in SGLang's trace) so that runs find it
        in the radix cache. Prefixes under MIN_CACHED_PREFIX characters, programs that cannot be traced, and
        backends without a prefix cache (OpenAIEndpoint) are left alone (False), as SGLang's."""
        b = resolve_backend(backend)
        arguments, _ = self._split((), {})
        try:
            prefix = constant_prefix(trace_graph(self.func, arguments, self.arg_names), b.chat_template())
        except NotTraceable:
            return False
        if len(prefix) < MIN_CACHED_PREFIX:
            return False
        return b.cache_prefix(prefix)

    # -- running -------------------------------------------------------------------------------
    def run(self, *args: Any, stream: bool = False, backend: Any = None, mode: str = "auto", use_thread: bool = True,
            **kwargs: Any) -> ProgramState:
        """Run once. mode: "auto" (request graph if static, else eager), "graph" or "eager". use_thread: SGLang's,
        accepted and ignored (a streamed run always runs on a thread of its own)."""
        if mode not in MODES:
            raise RadixflowError(f"mode must be one of {', '.join(MODES)}")
        b = resolve_backend(backend)
        arguments, defaults = self._split(args, kwargs)
        if stream and not b.streams_graphs and mode == "graph":
            raise RadixflowError(f"{type(b).__name__} cannot stream request graphs; use mode='auto' to stream eagerly")
        program = None if stream and not b.streams_graphs else self._compile(b, arguments, defaults, mode)
        if program is not None and stream:
            return _streamed_graph(program[0], program[1], b, defaults)
        if program is not None:
            return _replayed(program[0], _run_graphs(b, [program], program[0].name)[0], b, defaults)
        return self._run_eager(b, arguments, defaults, stream)

    async def run_async(self, *args: Any, **kwargs: Any) -> ProgramState:
        """`await f.run_async(...)`: run() on a worker thread, so one event loop can drive many
        programs at once. On an Engine their requests share scheduler steps; on a server they
        are concurrent HTTP requests."""
        return await in_thread(functools.partial(self.run, *args, **kwargs))

    def _compile(self, b, arguments: dict, defaults: dict, mode: str) -> Optional[tuple]:
        if mode == "eager" or not b.supports_graphs or (mode == "auto" and self.num_api_spec_tokens):
            if mode == "graph":
                raise RadixflowError(f"{type(b).__name__} cannot run request graphs")
            return None
        p = prepared(self, b, arguments, defaults)
        try:
            compiled = (p.graph, p.program, p) if p is not None else self._traced(b, arguments, defaults)
        except NotTraceable as e:
            if mode == "graph":  # the same exception (a DataDependentError stays one), saying what to change
                e.args = (f"{e}; mode='graph' needs a static program: use mode='auto' (it then runs eagerly) or "
                          "mode='eager'",)
                raise
            return None
        # text only (no gen, select or fork): nothing to send, the text is the result (the runtime refuses such a
        # graph, as /program does; SGLang runs the program)
        return compiled if _makes_requests(compiled[1]["ops"]) else None

    def _traced(self, b, arguments: dict, defaults: dict) -> tuple:
        graph = trace_graph(self.func, arguments, self.arg_names)
        return graph, lower(graph, b.chat_template(), defaults), None

    def _run_eager(self, b, arguments: dict, defaults: dict, stream: bool) -> ProgramState:
        ex = Interpreter(b, defaults, b.chat_template(), use_ids=b.tokenizer is not None, streaming=stream)
        if self.num_api_spec_tokens and not stream and not getattr(b, "chat", False):
            ex.spec = Speculation(self.num_api_spec_tokens)
        state = ProgramState(ex, "eager")
        if not stream:
            state.ret_value = self.func(state, **arguments)
            return state
        _in_thread(state, lambda: setattr(state, "ret_value", self.func(state, **arguments)), self.func.__name__)
        return state

    def run_batch(
        self,
        batch_kwargs: list,
        *,
        backend: Any = None,
        num_threads: Union[int, str] = "auto",
        progress_bar: bool = True,
        mode: str = "auto",
        generator_style: bool = False,
        **sampling: Any,
    ) -> Union[list[ProgramState], Iterator[ProgramState]]:
        """Run many; results in input order. Static programs go to the runtime together.
        generator_style=True (SGLang's): an iterator that yields each state, in input order, as
        soon as it and those before it are done; programs run GENERATOR_CHUNK at a time."""
        b = resolve_backend(backend)
        items = [dict(kw) if isinstance(kw, dict) else {"args": tuple(kw)} for kw in batch_kwargs]
        if generator_style:
            return self._run_batch_iter(b, items, _threads(num_threads, min(len(items), GENERATOR_CHUNK)),
                                        progress_bar, mode, sampling)  # fmt: skip
        calls = [self._split(it.pop("args", ()), {**it, **sampling}) for it in items]
        states: list = [None] * len(calls)
        bar = _progress(len(calls), progress_bar, self.func.__name__)
        compiled = {i: self._compile(b, a, d, mode) for i, (a, d) in enumerate(calls)}
        static = [i for i, c in compiled.items() if c is not None]
        for i, out in zip(static, self._graph_outs(b, [compiled[i] for i in static], bar)):
            states[i] = _replayed_or_failed(compiled[i][0], out, b, calls[i][1])
        rest = [i for i in range(len(calls)) if states[i] is None]
        threads = _threads(num_threads, len(rest))

        def one(i: int) -> ProgramState:
            try:
                state = self._run_eager(b, calls[i][0], calls[i][1], False)
            except GenerationError as e:  # the backend's (a refused parameter, a prompt over the context): its own
                state = _failed(b, calls[i][1], e)
            bar.update(1)
            return state

        with ThreadPoolExecutor(threads) as pool:
            for i, state in zip(rest, pool.map(one, rest)):
                states[i] = state
        bar.close()
        return states

    def _graph_outs(self, b, compiled: list, bar) -> list:
        """Each graph's results ({"error"} for one the backend refused alone), or for all of them the
        GenerationError that failed the whole call."""
        if not compiled:
            return []
        try:
            return _run_graphs(b, compiled, self.func.__name__, lambda k, out: bar.update(1))
        except GenerationError as e:
            return [e] * len(compiled)

    def _run_batch_iter(
        self, b, items: list, threads: int, progress_bar: bool, mode: str, sampling: dict
    ) -> Iterator[ProgramState]:
        """run_batch(generator_style=True): each program is one run() on a worker thread (on an
        Engine their requests share scheduler steps, as run_async's do)."""
        bar = _progress(len(items), progress_bar, self.func.__name__)
        try:  # the bar closes also when the caller stops reading early
            with ThreadPoolExecutor(threads) as pool:
                for start in range(0, len(items), GENERATOR_CHUNK):
                    futures = []
                    for it in items[start : start + GENERATOR_CHUNK]:
                        kw = {**{k: v for k, v in it.items() if k != "args"}, **sampling}
                        futures.append(pool.submit(self._run_kept, b, it.get("args", ()), mode, kw))
                        futures[-1].add_done_callback(lambda _: bar.update(1))
                    for f in futures:
                        yield f.result()
        finally:
            bar.close()

    def _run_kept(self, b, args: tuple, mode: str, kwargs: dict) -> ProgramState:
        """run(), or a failed state where the backend failed the program (run_batch keeps the others)."""
        try:
            return self.run(*args, backend=b, mode=mode, **kwargs)
        except GenerationError as e:
            return _failed(b, self._split(args, dict(kwargs))[1], e)


GENERATOR_CHUNK = 256  # programs in flight at once under run_batch(generator_style=True)


def _run_graphs(b, compiled: list, name: str, on_result=None) -> list:
    """compiled: _compile's (graph, program, Prepared or None) of each program."""
    try:
        if all(c[2] is not None for c in compiled):
            return b.run_prepared([c[2] for c in compiled], on_result=on_result)
        return b.run_graphs([c[1] for c in compiled], on_result=on_result)
    except GenerationError:
        raise
    except (RadixflowError, ServerBusyError) as e:  # e.g. a gen's sampling params rejected before running; a busy
        raise GenerationError(f"program {name}: {e}") from e  # backend, as eager mode and a streamed graph raise it


def _in_thread(state: ProgramState, body: Callable[[], None], name: str) -> None:
    """Run a streaming program's body on its own thread; its error surfaces from
    text_iter / sync / reading the state."""
    log = state.executor.log

    def run() -> None:
        try:
            body()
        except BaseException as e:
            log.close(e)
            return
        log.close()

    state.thread = threading.Thread(target=run, daemon=True, name=f"rf-{name}")
    state.thread.start()


def _streamed_graph(graph: Graph, program: dict, b, defaults: dict) -> ProgramState:
    """A request graph whose main strand streams its text deltas (as an eager stream's
    text_iter gives them); once it finishes, the state holds the replayed results."""
    state = ProgramState(Interpreter(b, defaults, b.chat_template(), use_ids=False), "graph")
    log = state.executor.log

    def body() -> None:
        out = None
        try:
            for event in b.run_graph_stream(program):
                if "results" in event:
                    out = event
                else:
                    log.put(event["var"], event["text"], event.get("meta_info"))
        except GenerationError:
            raise
        except (RadixflowError, ServerBusyError) as e:  # the backend's, as run() raises it (fuzzing: a bare one escaped
            raise GenerationError(f"program {graph.name}: {e}") from e  # `except rf.ProgramError`)
        if out is None:
            raise GenerationError(f"program {graph.name}: the stream ended without a result")
        done = _replayed(graph, out, b, defaults)
        done.executor.log = log
        ret = state if done.ret_value is done else done.ret_value  # `return s`: the caller's state, as in run()
        state.executor, state.program_meta, state.ret_value = done.executor, done.program_meta, ret

    _in_thread(state, body, graph.name)
    return state


def _failed(b, defaults: dict, error: GenerationError) -> ProgramState:
    """A run_batch program the backend failed: as in SGLang, the batch's others are kept; its `error()` is the
    error, and reading a variable raises it."""
    state = ProgramState(Interpreter(b, defaults, b.chat_template(), use_ids=False), "eager")
    state.executor.log.close(error)
    return state


def _replayed_or_failed(graph: Graph, out: Union[dict, GenerationError], b, defaults: dict) -> ProgramState:
    """A run_batch graph's state: its results replayed, or a failed state for the error that failed it."""
    if isinstance(out, GenerationError):
        return _failed(b, defaults, out)
    try:
        return _replayed(graph, out, b, defaults)
    except GenerationError as e:
        return _failed(b, defaults, e)


def _replayed(graph: Graph, out: dict, b, defaults: dict) -> ProgramState:
    if out.get("error"):
        raise GenerationError(f"program {graph.name}: {out['error']}")
    for result in out.get("results", {}).values():
        for meta in metas(result):
            b.token_usage.add(meta)
    state = replay(graph, out, b.chat_template(), defaults)
    state.program_meta = out.get("meta_info", {})
    return state


def _threads(num_threads: Union[int, str], n: int) -> int:
    if num_threads == "auto":
        return max(1, min(n, 16 * (os.cpu_count() or 1), 128))
    return max(1, int(num_threads))


def _progress(total: int, enabled: bool, name: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=not enabled, desc=name, leave=False)


def function(func: Optional[Callable] = None, num_api_spec_tokens: Optional[int] = None):
    """Decorator: `@rf.function` or `@rf.function(num_api_spec_tokens=N)`. With N, the program
    runs eagerly with API speculative execution (lang/speculation.py) unless run(mode="graph")."""
    if func is None:
        return lambda f: Function(f, num_api_spec_tokens=num_api_spec_tokens)
    return Function(func, num_api_spec_tokens=num_api_spec_tokens)


