"""The scheduler's grammar seam: submit a constrained request, poll until its grammar is
compiled (or failed), and jump forward after sampled tokens.

    backend = GrammarBackend(tokenizer, vocab_size, eos_ids, server_args)
    backend.submit(req)          # starts compiling on the worker pool (or finds it in the cache)
    backend.poll(req)            # None: compiling; True: req.grammar set; False: req finished (400)
    backend.jump_forward(req, forced)  # after each sampled token: [] / [tokens] / (keep, [tokens])

The grammar backend (`--grammar-backend`: llguidance, outlines or auto, the server default) compiles
through `grammar.compile_grammar`, the path the public `Grammar` API takes too. `auto`
compiles every grammar on llguidance and moves busy json_schema / regex grammars to outlines
(auto_move.py); it stays on llguidance under tensor parallelism (each rank would switch at its own
time) and on a CPU scheduler. A compile that
runs past `--grammar-compile-timeout-s` (counted from when a worker starts it, not from
submission) fails only its own request; the worker finishes
it in the background (outlines-core cannot be interrupted), and a later request for the
same grammar uses the result if it ever completes.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
import weakref
from concurrent.futures import Future
from typing import Optional, Union

from radixflow.constrained.auto_move import AutoMover
from radixflow.constrained.cache import GrammarCache
from radixflow.constrained.grammar import compile_grammar, grammar_backend
from radixflow.constrained.json_any import DEFAULT_DEPTH
from radixflow.constrained.options import DEFAULT_BACKEND, DEFAULT_COMPILE_TIMEOUT_S, GrammarOptions, TokenizerInfo
from radixflow.errors import RadixflowError

log = logging.getLogger(__name__)
QUEUE_LIMIT_FACTOR = 30  # a grammar still queued after this many compile time limits fails (503)


class GrammarBackend:
    def __init__(self, tokenizer, vocab_size: int, eos_ids: set, server_args=None, whitespace: Optional[str] = None,
                 promote: bool = True):
        """`whitespace`: the JSON whitespace pattern; None takes the server's
        constrained_json_whitespace_pattern (itself None = compact JSON). `promote`: auto may move
        busy grammars to outlines (the scheduler passes False off the GPU)."""
        if whitespace is None:
            whitespace = getattr(server_args, "constrained_json_whitespace_pattern", None)
        self.options = GrammarOptions(whitespace or None, getattr(server_args, "constrained_json_any_depth", DEFAULT_DEPTH))
        self.name = getattr(server_args, "grammar_backend", DEFAULT_BACKEND)
        self.timeout_s = getattr(server_args, "grammar_compile_timeout_s", DEFAULT_COMPILE_TIMEOUT_S)
        self.jump_enabled = not getattr(server_args, "disable_jump_forward", False)
        self.cache = GrammarCache(getattr(server_args, "grammar_compile_workers", 2))
        single = getattr(server_args, "tp_size", 1) == 1
        self.mover = AutoMover(self) if promote and self.name == "auto" and single else None  # None: no moves
        # an EOS id past the tokenizer's vocabulary (a model config paired with another model's
        # tokenizer, as benchmarks do with dummy weights) cannot end a grammar; llguidance refuses it
        self.info = TokenizerInfo(tokenizer, vocab_size, tuple(sorted(i for i in eos_ids if i < len(tokenizer))))
        from radixflow.constrained.llguidance_threads import set_threads  # here: importing llguidance takes time

        set_threads(getattr(server_args, "grammar_threads", 0))  # also 0: resets the size an earlier Engine set
        # the backend (vocabulary / llguidance tokenizer) is built by the pool too, ahead of any compile (FIFO)
        first = self.backend_for("regex")
        self._impls = {first: self.cache.pool.submit(grammar_backend, first, self.info)}  # name -> Future
        self._built: dict = {}  # name -> backend, once built: the jump hook looks one up every row and step, and
        # grammar_backend's lru_cache would hash TokenizerInfo each time
        self._jobs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    @property
    def impl(self):
        """The configured backend (auto's first one, llguidance; ebnf grammars always run on llguidance)."""
        return self.impl_for("regex")

    def backend_for(self, kind: str) -> str:
        """The backend a new grammar of `kind` compiles on (auto: llguidance, until promoted)."""
        return "llguidance" if kind == "ebnf" or self.name == "auto" else self.name

    def impl_for(self, kind: str):
        return self.impl_named(self.backend_for(kind))

    def impl_named(self, name: str):
        impl = self._built.get(name)
        if impl is None:
            started = self._impls.get(name)  # else built where first needed (in a compile job: not waiting on the pool)
            impl = self._built[name] = grammar_backend(name, self.info) if started is None else started.result()
        return impl

    # -- compile ---------------------------------------------------------------------------------
    def submit(self, req) -> None:
        kind, spec = req.sampling.grammar
        moved = self.mover.on_request(kind, spec) if self.mover is not None and kind != "ebnf" else None
        name = "outlines" if moved is not None else self.backend_for(kind)
        job = moved if moved is not None else self.compile_async(kind, spec)
        self._jobs[req] = (job, time.monotonic(), name)

    def compile_key(self, kind: str, spec) -> tuple:
        """The grammar cache's key of the compile that compile_async makes for (kind, spec)."""
        return (self.backend_for(kind), kind, spec, self.options)

    def compile_async(self, kind: str, spec) -> Future:
        key = self.compile_key(kind, spec)
        name = key[0]
        if self.mover is not None and kind != "ebnf":
            return self.cache.get(key, lambda: self._compile_movable(kind, spec))
        return self.cache.get(key, lambda: compile_grammar(self.impl_named(name), kind, spec, self.options, self.timeout_s))

    def _compile_movable(self, kind: str, spec):
        """auto: a json_schema / regex grammar compiled on llguidance from the regex outlines will
        compile, so a move to outlines keeps its language; one whose regex cannot be made, or that
        llguidance refuses as a regex, compiles from its spec and never moves (its `regex` is None)."""
        from radixflow.constrained.spec import to_regex  # outlines-core: only auto needs it here

        impl = self.impl_named("llguidance")
        try:
            regex = to_regex(kind, spec, self.options.whitespace or "", self.options.any_depth)  # checks the spec
            return compile_grammar(impl, kind, spec, self.options, self.timeout_s, checked=True, regex=regex)
        except RadixflowError as e:
            log.info("auto: a %s grammar stays on llguidance (compiled from its spec): %s", kind, e)
        return compile_grammar(impl, kind, spec, self.options, self.timeout_s)

    def switch_moved(self, reqs: list) -> int:
        """auto: the rows of `reqs` whose grammar has moved go on on outlines (AutoMover.switch). The
        scheduler calls it after each step's tokens are accepted; returns the rows switched."""
        return 0 if self.mover is None else self.mover.switch(reqs)

    def wait_for_moves(self) -> None:
        """Blocks until the outlines compiles under way are done (benchmarks: before timing)."""
        if self.mover is not None:
            concurrent.futures.wait(self.mover.compiles_under_way())

    def compile(self, kind: str, spec):
        """Blocking; raises RadixflowError (GrammarError) or TimeoutError past the limit."""
        return self.compile_async(kind, spec).result(timeout=self.timeout_s)

    # -- the scheduler's calls -------------------------------------------------------------------------
    def poll(self, req, clock: bool = True) -> Optional[bool]:
        """`clock` False: no time limit (a tensor-parallel rank > 0 catching up with a grammar that
        rank 0 compiled bounds its own wait, grammar_wait._follow)."""
        job = self._jobs.get(req)
        if job is None:
            return None
        fut, submitted, name = job
        if not fut.done():
            return self._check_clock(req, fut, submitted) if clock else None
        del self._jobs[req]
        error = fut.exception()
        if error is not None:
            return self._reject(req, _message(error))
        moved = self.mover.moved(*req.sampling.grammar) if name == "llguidance" and self.mover is not None else None
        grammar, name = (moved, "outlines") if moved is not None else (fut.result(), name)  # auto: moved meanwhile
        budget = req.sampling.max_new_tokens - req.segment_len
        if grammar.min_tokens is not None and grammar.min_tokens > budget:
            return self._reject(
                req,
                f"max_new_tokens={req.sampling.max_new_tokens} is too small for this grammar: the shortest "
                f"output it could find takes {grammar.min_tokens} tokens; raise max_new_tokens to at least {grammar.min_tokens}",
            )
        impl = self.impl_named(name)
        req.grammar = impl.matcher(grammar, req, self.cache.pool)  # llguidance: further builds of a busy grammar
        if name == "llguidance" and self.mover is not None and grammar.regex is not None:
            self.mover.track(req)  # its grammar may move while it runs
        if self.jump_enabled and not req.logprob.return_logprob and not req.grammar.is_terminated():
            forced = impl.jump(req.grammar, req, first=True)
            if forced:
                req.output_ids.extend(forced)
                req.jump_forward_tokens += len(forced)
        return True

    def forget(self, req) -> None:
        """Drop a request's compile job (its outcome was decided elsewhere: tensor-parallel rank 0)."""
        self._jobs.pop(req, None)

    def has_job(self, req) -> bool:
        """Whether a compile job of `req` is kept here (submitted, not yet polled to an outcome nor forgotten)."""
        return req in self._jobs

    def job_state(self, req) -> str:
        """Where a request's compile stands, in words (for the error of a rank that waited too long)."""
        job = self._jobs.get(req)
        if job is None:
            return "this rank has no compile job for it"
        fut, submitted, _ = job
        started, now = self.cache.started_at(fut), time.monotonic()
        if fut.done():
            return "its compile is done"
        if started is None:
            return f"its compile has waited {now - submitted:.1f} s for a compile worker"
        return f"its compile has run for {now - max(started, submitted):.1f} s"

    def _check_clock(self, req, fut: Future, submitted: float) -> Optional[bool]:
        """None while the compile may go on; False (req failed) past the time limit, which
        counts compile time only: from when a worker began it (or from this request's
        submission, for a compile another request started), not time queued behind others."""
        now, started = time.monotonic(), self.cache.started_at(fut)
        if started is None:
            if now - submitted <= QUEUE_LIMIT_FACTOR * self.timeout_s:
                return None
            del self._jobs[req]
            return self._reject(
                req,
                f"the grammar compile workers were busy for {now - submitted:.0f} s before this grammar's turn; "
                "retry later, or raise --grammar-compile-workers",
                status=503,
            )
        if now - max(started, submitted) <= self.timeout_s:
            return None
        del self._jobs[req]
        return self._reject(
            req,
            f"compiling this grammar took longer than the {self.timeout_s:g} s limit "
            "(--grammar-compile-timeout-s); simplify it (fewer/shorter patterns, smaller enums, bounds)",
        )

    def wait(self, reqs: list, timeout: float) -> None:
        """Block until one of `reqs`' grammars is compiled, or `timeout` seconds (for an
        idle scheduler, instead of spinning while the compile threads need the CPU)."""
        jobs = [self._jobs[r][0] for r in reqs if r in self._jobs]
        if jobs:
            concurrent.futures.wait(jobs, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)

    def jump_forward(self, req, forced: bool = True, limit: Optional[int] = None, cut: bool = True) -> Union[list, tuple]:
        """Forced tokens to append (when jump-forward is on and the caller allows it: `forced`;
        at most `limit`; `cut` False: no re-tokenizing of the sampled token), or on llguidance the
        replacement of a sampled token that left no completion within the budget."""
        if req.grammar is None or req.grammar.is_terminated():
            return []
        impl = self.impl_named(req.grammar.backend)
        jumps = forced and self.jump_enabled and not req.logprob.return_logprob  # a jumped token has no logprob
        return impl.jump(req.grammar, req, forced=jumps, limit=limit, cut=cut)

    @staticmethod
    def _reject(req, message: str, status: int = 400) -> bool:
        req.finish({"type": "abort", "message": message, "status_code": status})
        return False


def jump_parts(forced: Union[list, tuple], outputs: int) -> tuple[int, list]:
    """The jump hook's result as (output tokens to keep, tokens to append), for a request
    with `outputs` output tokens."""
    return forced if isinstance(forced, tuple) else (outputs, forced)


def apply_jump(output_ids: list, forced: Union[list, tuple]) -> int:
    """Apply the jump hook's result to a bare output list (no KV behind it): cut back, then
    append. Returns how many output tokens were cut."""
    keep, tokens = jump_parts(forced, len(output_ids))
    cut = len(output_ids) - keep
    del output_ids[keep:]
    output_ids.extend(tokens)
    return cut


def _message(error: BaseException) -> str:
    if isinstance(error, RadixflowError):
        return str(error)
    log.exception("grammar compilation failed", exc_info=error)
    return f"the grammar could not be compiled ({type(error).__name__}: {error}); simplify it"
