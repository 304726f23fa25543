"""The scheduler's grammar seam: submit a constrained request, poll until its grammar is
compiled (or failed), and jump forward after sampled tokens.

    backend = GrammarBackend(tokenizer, vocab_size, eos_ids, server_args)
    backend.submit(req)          # starts compiling on the worker pool (or finds it in the cache)
    backend.poll(req)            # None: compiling; True: req.grammar set; False: req finished (400)
    backend.jump_forward(req, forced)  # after each sampled token: [] / [tokens] / (keep, [tokens])

The grammar backend (`--grammar-backend`: llguidance, outlines or auto, the server default) compiles
through `grammar.compile_grammar`, the path the public `Grammar` API takes too. `auto`
compiles every grammar on llguidance (milliseconds); a json_schema / regex grammar from the regex
outlines makes of it (so its language is the same on both backends; a spec without such a regex
compiles from the spec and never moves). One that has had PROMOTE_AFTER requests is also compiled
on outlines, in the background in a child process (isolated_compile.py: the scheduler's GIL is not
held for it, and it never delays a request's compile), and once that compile is done the
grammar's new requests run on outlines, whose masks are cached per FSM state (at large batches
llguidance's per-step mask work is what bounds a GPU step), and its rows still running on llguidance
switch to outlines after their step (switch_moved). The move is bounded: one background
compile at a time; a grammar whose byte-level DFA has more than PROMOTE_MAX_DFA_STATES states is
refused before its token index is built; the child is killed past the compile time limit or
PROMOTE_MAX_MEMORY, and refuses arrays over PROMOTE_MAX_BYTES; a refused grammar stays on llguidance
and is not tried again; at most MAX_PROMOTED moved grammars are kept, least recently used evicted.
What still pauses the scheduler is unpickling the child's result (benchmark schema: ~0.16 s). auto stays on llguidance under tensor
parallelism (each rank would switch at its own time) and on a CPU scheduler. A compile that
runs past `--grammar-compile-timeout-s` (counted from when a worker starts it, not from
submission) fails only its own request; the worker finishes
it in the background (outlines-core cannot be interrupted), and a later request for the
same grammar uses the result if it ever completes.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Optional, Union

from radixflow.constrained.cache import GrammarCache
from radixflow.constrained.grammar import compile_grammar, grammar_backend
from radixflow.constrained.isolated_compile import Limits
from radixflow.constrained.json_any import DEFAULT_DEPTH
from radixflow.constrained.options import (
    DEFAULT_BACKEND, DEFAULT_COMPILE_TIMEOUT_S, PROMOTE_AFTER, GrammarOptions, TokenizerInfo,
)  # fmt: skip
from radixflow.errors import GrammarError, RadixflowError

log = logging.getLogger(__name__)
QUEUE_LIMIT_FACTOR = 30  # a grammar still queued after this many compile time limits fails (503)
MAX_COUNTED = 4096  # grammars whose requests `auto` counts; the counts restart past it
# bounds on auto's moves: the benchmark schema's byte DFA has 2,433 states (3.6 s, ~235 MiB kept on a 49k
# vocabulary); a string of maxLength 500 has 5,010 (8.3 s, 1.5 GiB), so such a grammar stays on llguidance
PROMOTE_MAX_DFA_STATES = 3000
PROMOTE_MAX_BYTES = 512 << 20  # a moved grammar's token / next-distance arrays
PROMOTE_MAX_MEMORY = 4 << 30  # the compile process's added address space (benchmark schema: ~0.9 GiB at its peak)
MAX_PROMOTED = 4  # moved grammars kept (each holds its arrays and outlines-core's index)


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
        # auto's outlines compiles of busy grammars: one at a time, behind no request's compile
        single = getattr(server_args, "tp_size", 1) == 1
        self.promotions = GrammarCache(1, MAX_PROMOTED) if promote and self.name == "auto" and single else None
        self._uses: collections.Counter = collections.Counter()
        self._refused: dict = {}  # keys auto will not move again (refused or discarded), oldest first
        self._refused_lock = threading.Lock()  # a move that fails records its refusal from its worker thread
        self._moving: Optional[Future] = None  # the one background compile allowed at a time
        self._unswitched: list = []  # (move, (kind, spec)) of moves whose running rows switch_moved has not yet seen done
        self.move_limit_s = self.timeout_s  # a move's compile process is killed past this
        # an EOS id past the tokenizer's vocabulary (a model config paired with another model's
        # tokenizer, as benchmarks do with dummy weights) cannot end a grammar; llguidance refuses it
        self.info = TokenizerInfo(tokenizer, vocab_size, tuple(sorted(i for i in eos_ids if i < len(tokenizer))))
        from radixflow.constrained.llguidance_threads import set_threads  # here: importing llguidance takes time

        set_threads(getattr(server_args, "grammar_threads", 0))  # also 0: resets the size an earlier Engine set
        # the backend (vocabulary / llguidance tokenizer) is built by the pool too, ahead of any compile (FIFO)
        first = self.backend_for("regex")
        self._impls = {first: self.cache.pool.submit(grammar_backend, first, self.info)}  # name -> Future
        self._built: dict = {}  # name -> backend, once built (the jump hook looks one up every row and step)
        self._jobs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    @property
    def impl(self):
        """The configured backend (auto's first one, llguidance; ebnf grammars always run on llguidance)."""
        return self.impl_for("regex")

    def backend_for(self, kind: str) -> str:
        """The backend a new grammar of `kind` compiles on (auto: llguidance, until promoted)."""
        return "llguidance" if kind == "ebnf" or self.name == "auto" else self.name

    def impl_for(self, kind: str):
        return self._impl_named(self.backend_for(kind))

    def _impl_named(self, name: str):
        impl = self._built.get(name)
        if impl is None:
            started = self._impls.get(name)  # else built where first needed (in a compile job: not waiting on the pool)
            impl = self._built[name] = grammar_backend(name, self.info) if started is None else started.result()
        return impl

    # -- compile ---------------------------------------------------------------------------------
    def submit(self, req) -> None:
        kind, spec = req.sampling.grammar
        promoted = self._promoted(kind, spec)
        name = "outlines" if promoted is not None else self.backend_for(kind)
        job = promoted if promoted is not None else self.compile_async(kind, spec)
        self._jobs[req] = (job, time.monotonic(), name)

    def compile_async(self, kind: str, spec) -> Future:
        name = self.backend_for(kind)
        key = (name, kind, spec, self.options)
        if self.promotions is not None and kind != "ebnf":
            return self.cache.get(key, lambda: self._compile_movable(kind, spec))
        return self.cache.get(key, lambda: compile_grammar(self._impl_named(name), kind, spec, self.options, self.timeout_s))

    def _compile_movable(self, kind: str, spec):
        """auto: a json_schema / regex grammar compiled on llguidance from the regex outlines will
        compile, so a move to outlines keeps its language; one whose regex cannot be made, or that
        llguidance refuses as a regex, compiles from its spec and never moves (its `regex` is None)."""
        from radixflow.constrained.spec import to_regex  # outlines-core: only auto needs it here

        impl = self._impl_named("llguidance")
        try:
            regex = to_regex(kind, spec, self.options.whitespace or "", self.options.any_depth)  # checks the spec
            return compile_grammar(impl, kind, spec, self.options, self.timeout_s, regex=regex)
        except RadixflowError as e:
            log.info("auto: a %s grammar stays on llguidance (compiled from its spec): %s", kind, e)
        return compile_grammar(impl, kind, spec, self.options, self.timeout_s)

    def _promoted(self, kind: str, spec) -> Optional[Future]:
        """auto: the grammar's finished outlines compile, if it has one; else counts the request,
        and from the PROMOTE_AFTER-th request of a json_schema / regex grammar on, that compile is
        started, unless another one is running (a later request starts it then). A grammar compiled
        from its spec (no outlines regex) is refused then, without a move."""
        if self.promotions is None or kind == "ebnf":
            return None
        key = ("outlines", kind, spec, self.options)  # promotion() reads the same key
        if key in self._refused:
            return None
        done = self.promotions.peek(key, touch=True)
        if done is not None and done.done():
            return done if done.exception() is None else None  # a failed move refused itself (_move)
        if len(self._uses) > MAX_COUNTED:
            self._uses.clear()  # refusals are kept apart: a refused grammar is never compiled again
        self._uses[key] += 1
        idle = self._moving is None or self._moving.done()
        if done is None and idle and self._uses[key] >= PROMOTE_AFTER:
            if _compiled_from_spec(self.cache.peek((self.backend_for(kind), kind, spec, self.options))):
                log.info("auto: a %s grammar stays on llguidance: outlines cannot compile it to the same language", kind)
                self._refuse(key)
                return None
            self._moving = self.promotions.get(key, lambda: self._move(key))
            self._unswitched.append((self._moving, (kind, spec)))
        return None

    def _refuse(self, key) -> None:
        """Remembers that `key` is not to be moved; past MAX_COUNTED refusals the oldest is forgotten."""
        with self._refused_lock:
            self._refused[key] = True
            if len(self._refused) > MAX_COUNTED:
                del self._refused[next(iter(self._refused))]

    def _move(self, key):
        """The background outlines compile of a busy grammar, within auto's bounds (GrammarError past them),
        from the regex its llguidance compile was made from (its language stays). One that fails is refused
        and leaves the moved grammars' LRU before its future is done, not on the grammar's next request."""
        try:
            return self._compile_moved(*key[1:3])
        except Exception:
            self._refuse(key)
            self.promotions.discard(key)
            raise

    def _compile_moved(self, kind: str, spec):
        regex = getattr(self.compile_async(kind, spec).result(), "regex", None)
        if regex is None:
            log.info("auto: a %s grammar stays on llguidance: outlines cannot compile it to the same language", kind)
            raise GrammarError("compiled from its spec: not moved")
        start = time.monotonic()
        limits = Limits(time_s=self.move_limit_s, max_bytes=PROMOTE_MAX_BYTES, memory_bytes=PROMOTE_MAX_MEMORY)
        try:
            grammar = compile_grammar(self._impl_named("outlines"), kind, spec, self.options, self.timeout_s, regex=regex,
                                      max_dfa_states=PROMOTE_MAX_DFA_STATES, isolate=limits)
        except RadixflowError as e:
            log.info("auto: a %s grammar stays on llguidance: %s", kind, e)
            raise
        log.info("auto: a %s grammar moves to outlines (compiled in %.1f s, %d MiB)", kind, time.monotonic() - start,
                 (grammar.tokens.nbytes + grammar.next_dist.nbytes) >> 20)
        return grammar

    def switch_moved(self, reqs: list) -> int:
        """auto: once a move has finished, the unfinished rows of `reqs` still on llguidance for that grammar go on
        on outlines, their tokens walked through its FSM (one language), so a batch that arrived before the move
        does not run to its end on llguidance's slower masks. A row whose tokens outlines cannot walk, whose
        budget no longer fits outlines' shortest completion, or with a repair pending, stays. The scheduler calls
        it after each step's tokens are accepted (none in flight for these rows); returns the rows switched. Every
        finished move is seen once, also one finished before a step saw it and another move started meanwhile."""
        done = [(move, spec) for move, spec in self._unswitched if move.done()]
        if not done:
            return 0
        self._unswitched = [pair for pair in self._unswitched if pair not in done]
        from radixflow.constrained.matcher import GrammarMatcher

        moved, switched = {spec: move.result() for move, spec in done if move.exception() is None}, 0
        for req in reqs:
            old = req.grammar
            grammar = moved.get(req.sampling.grammar) if old is not None and old.backend == "llguidance" else None
            if req.finished or grammar is None or old.undo or old.is_terminated():
                continue
            new = GrammarMatcher(grammar, req)
            if new.advance_all(req.output_ids[req.segment_start :]) and new.distance() <= new.budget():
                req.grammar, switched = new, switched + 1
        return switched

    def _moved(self, kind: str, spec):
        """auto: the grammar's finished outlines compile; None while it has none."""
        done = self.promotion(kind, spec)
        return done.result() if done is not None and done.done() and done.exception() is None else None

    def promotion(self, kind: str, spec) -> Optional[Future]:
        """auto: the grammar's outlines compile, if one was started and is still kept."""
        return None if self.promotions is None else self.promotions.peek(("outlines", kind, spec, self.options))

    @property
    def last_move(self) -> Optional[Future]:
        """auto: the latest move (background outlines compile) started, done or not; None before any."""
        return self._moving

    def wait_for_promotions(self) -> None:
        """Blocks until the outlines compiles under way are done (benchmarks: before timing)."""
        if self.promotions is not None:  # a failed move leaves the LRU just before it is done: _moving too
            concurrent.futures.wait([*self.promotions.entries.values(), *filter(None, [self._moving])])

    def compile(self, kind: str, spec):
        """Blocking; raises RadixflowError (GrammarError) or TimeoutError past the limit."""
        return self.compile_async(kind, spec).result(timeout=self.timeout_s)

    # -- the scheduler's calls -------------------------------------------------------------------------
    def poll(self, req) -> Optional[bool]:
        job = self._jobs.get(req)
        if job is None:
            return None
        fut, submitted, name = job
        if not fut.done():
            return self._check_clock(req, fut, submitted)
        del self._jobs[req]
        error = fut.exception()
        if error is not None:
            return self._reject(req, _message(error))
        moved = self._moved(*req.sampling.grammar) if name == "llguidance" else None
        grammar, name = (moved, "outlines") if moved is not None else (fut.result(), name)  # auto: moved meanwhile
        budget = req.sampling.max_new_tokens - req.segment_len
        if grammar.min_tokens is not None and grammar.min_tokens > budget:
            return self._reject(
                req,
                f"max_new_tokens={req.sampling.max_new_tokens} is too small for this grammar: the shortest "
                f"output it could find takes {grammar.min_tokens} tokens; raise max_new_tokens to at least {grammar.min_tokens}",
            )
        impl = self._impl_named(name)
        req.grammar = impl.matcher(grammar, req, self.cache.pool)  # llguidance: further builds of a busy grammar
        if self.jump_enabled and not req.grammar.is_terminated():
            forced = impl.jump(req.grammar, req, first=True)
            if forced:
                req.output_ids.extend(forced)
                req.jump_forward_tokens += len(forced)
        return True

    def forget(self, req) -> None:
        """Drop a request's compile job (its outcome was decided elsewhere: tensor-parallel rank 0)."""
        self._jobs.pop(req, None)

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
        impl = self._impl_named(req.grammar.backend)
        return impl.jump(req.grammar, req, forced=forced and self.jump_enabled, limit=limit, cut=cut)

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


def _compiled_from_spec(compiled: Optional[Future]) -> bool:
    """auto: whether a grammar's finished llguidance compile was made from its spec (no outlines regex)."""
    return compiled is not None and compiled.done() and compiled.exception() is None and compiled.result().regex is None


def _message(error: BaseException) -> str:
    if isinstance(error, RadixflowError):
        return str(error)
    log.exception("grammar compilation failed", exc_info=error)
    return f"the grammar could not be compiled ({type(error).__name__}: {error}); simplify it"
