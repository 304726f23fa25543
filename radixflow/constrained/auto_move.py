"""`--grammar-backend auto`'s moves of busy grammars from llguidance to outlines.

Every grammar compiles on llguidance first (milliseconds); a json_schema / regex one from the regex
outlines makes of it, so its language is the same on both backends (a spec without such a regex
compiles from the spec and never moves). Once a grammar has had PROMOTE_AFTER requests it is also
compiled on outlines, in the background in a child process (isolated_compile.py: the scheduler's GIL
is not held for it, and it never delays a request's compile). Once that compile is done, the
grammar's new requests run on outlines, whose masks are cached per FSM state (at large batches
llguidance's per-step mask work is what bounds a GPU step), and its rows still on llguidance switch
to outlines after one of their steps (`switch`).

The move is bounded: one background compile at a time; a grammar whose byte-level DFA has more than
MOVE_MAX_DFA_STATES states is refused before its token index is built; the child is killed past the
compile time limit or MOVE_MAX_MEMORY, and refuses arrays over MOVE_MAX_BYTES; a refused grammar
stays on llguidance and is not tried again; at most MAX_MOVED moved grammars are kept, least
recently used evicted. What still pauses the scheduler is unpickling the child's result (benchmark
schema: ~0.16 s).

    mover = AutoMover(backend)
    mover.on_request(kind, spec)   # the finished move's Future, or None (the request is counted)
    mover.moved(kind, spec)        # the moved grammar once its compile is done, else None
    mover.track(req)               # a row handed an llguidance matcher of a movable grammar
    mover.switch(reqs)             # rows of finished moves go on on outlines
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import weakref
from concurrent.futures import Future
from typing import TYPE_CHECKING, Optional

from radixflow.constrained.cache import GrammarCache
from radixflow.constrained.grammar import compile_grammar
from radixflow.constrained.isolated_compile import Limits
from radixflow.constrained.options import PROMOTE_AFTER
from radixflow.errors import GrammarError, RadixflowError

if TYPE_CHECKING:
    from radixflow.constrained.backend import GrammarBackend

log = logging.getLogger(__name__)
MAX_COUNTED = 4096  # grammars whose requests are counted; the counts restart past it
# the benchmark schema's byte DFA has 2,433 states (3.6 s, ~235 MiB kept on a 49k vocabulary); a string
# of maxLength 500 has 5,010 (8.3 s, 1.5 GiB), so such a grammar stays on llguidance
MOVE_MAX_DFA_STATES = 3000
MOVE_MAX_BYTES = 512 << 20  # a moved grammar's token / next-distance arrays
MOVE_MAX_MEMORY = 4 << 30  # the compile process's added address space (benchmark schema: ~0.9 GiB at its peak)
MAX_MOVED = 4  # moved grammars kept (each holds its arrays and outlines-core's index)


class AutoMover:
    def __init__(self, backend: "GrammarBackend"):
        self.backend = backend
        self.compiles = GrammarCache(1, MAX_MOVED)  # the outlines compiles, started and finished, LRU
        self.limit_s = backend.timeout_s  # a move's compile process is killed past this
        self.counts: collections.Counter = collections.Counter()
        self.refused: dict = {}  # keys not to be moved again (refused or failed), oldest first
        self._refused_lock = threading.Lock()  # a move that fails records its refusal from its worker thread
        self.running: Optional[Future] = None  # the one background compile allowed at a time
        self._unseen: list = []  # (future, (kind, spec)) of started moves no switch() has seen done
        self._to_switch: dict = {}  # (kind, spec) -> moved grammar, while a row of it may still be on llguidance
        self._rows: dict = {}  # (kind, spec) -> WeakSet of rows handed an llguidance matcher of that movable grammar
        self._staying: "weakref.WeakSet" = weakref.WeakSet()  # rows that could not switch (not tried again)

    def key(self, kind: str, spec) -> tuple:
        return ("outlines", kind, spec, self.backend.options)

    def compile_of(self, kind: str, spec) -> Optional[Future]:
        """The grammar's outlines compile, if one was started and is still kept."""
        return self.compiles.peek(self.key(kind, spec))

    def moved(self, kind: str, spec):
        """The grammar's moved (outlines) grammar once its compile is done; None before, or if it failed."""
        done = self.compile_of(kind, spec)
        return done.result() if _succeeded(done) else None

    def on_request(self, kind: str, spec) -> Optional[Future]:
        """The grammar's finished move, if it has one; else counts the request, and from the
        PROMOTE_AFTER-th request on starts the move unless another one is running (a later request
        starts it then). A grammar compiled from its spec (no outlines regex) is refused then."""
        key = self.key(kind, spec)
        if key in self.refused:
            return None
        done = self.compiles.peek(key, touch=True)
        if done is not None and done.done():
            return done if done.exception() is None else None  # a failed move refused itself (_compile)
        if len(self.counts) > MAX_COUNTED:
            self.counts.clear()  # refusals are kept apart: a refused grammar is never compiled again
        self.counts[key] += 1
        idle = self.running is None or self.running.done()
        if done is None and idle and self.counts[key] >= PROMOTE_AFTER:
            self._start(key, kind, spec)
        return None

    def _start(self, key: tuple, kind: str, spec) -> None:
        llguidance = self.backend.cache.peek(self.backend.compile_key(kind, spec))
        if _compiled_from_spec(llguidance):
            _log_from_spec(kind)
            self._refuse(key)
            return
        self.running = self.compiles.get(key, lambda: self._compile(key))
        self._unseen.append((self.running, (kind, spec)))

    def _refuse(self, key: tuple) -> None:
        """Remembers that `key` is not to be moved; past MAX_COUNTED refusals the oldest is forgotten."""
        with self._refused_lock:
            self.refused[key] = True
            if len(self.refused) > MAX_COUNTED:
                del self.refused[next(iter(self.refused))]

    def _compile(self, key: tuple):
        """The background outlines compile, within the bounds (GrammarError past them), from the regex the
        grammar's llguidance compile was made from (its language stays). One that fails is refused and
        leaves the LRU before its future is done, not on the grammar's next request."""
        try:
            return self._compile_outlines(*key[1:3])
        except Exception:
            self._refuse(key)
            self.compiles.discard(key)
            raise

    def _compile_outlines(self, kind: str, spec):
        regex = getattr(self.backend.compile_async(kind, spec).result(), "regex", None)
        if regex is None:  # the llguidance compile was still running when _start checked it
            _log_from_spec(kind)
            raise GrammarError("compiled from its spec: not moved")
        start = time.monotonic()
        limits = Limits(time_s=self.limit_s, max_bytes=MOVE_MAX_BYTES, memory_bytes=MOVE_MAX_MEMORY)
        try:
            grammar = compile_grammar(self.backend.impl_named("outlines"), kind, spec, self.backend.options,
                                      self.backend.timeout_s, checked=True, regex=regex,
                                      max_dfa_states=MOVE_MAX_DFA_STATES, isolate=limits)
        except RadixflowError as e:
            log.info("auto: a %s grammar stays on llguidance: %s", kind, e)
            raise
        log.info("auto: a %s grammar moves to outlines (compiled in %.1f s, %d MiB)", kind, time.monotonic() - start,
                 (grammar.tokens.nbytes + grammar.next_dist.nbytes) >> 20)
        return grammar

    def track(self, req) -> None:
        """`req` runs on llguidance with a grammar that may move: switch() may find it after the move."""
        spec = req.sampling.grammar
        if self.key(*spec) in self.refused:
            return
        if len(self._rows) > MAX_COUNTED:  # grammars whose rows are all gone
            self._rows = {s: rows for s, rows in self._rows.items() if rows}
        self._rows.setdefault(spec, weakref.WeakSet()).add(req)

    def compiles_under_way(self) -> list:
        """The compiles to wait for (a failed move leaves the LRU just before it is done: `running` too)."""
        return [*self.compiles.futures(), *filter(None, [self.running])]

    def switch(self, reqs: list) -> int:
        """Rows of `reqs` (their step's tokens accepted, none in flight) still on llguidance for a grammar
        whose move has finished go on on outlines, their tokens walked through its FSM (one language), so
        a batch that arrived before the move does not run to its end on llguidance's slower masks. A row
        with a repair pending waits for a later step; one whose tokens outlines cannot walk, or whose
        budget no longer fits outlines' shortest completion, stays. A finished move is kept until no
        unfinished row of its grammar is left on llguidance, so rows missing from the call that first
        saw it finished (an extend step's new rows only) switch in a later one. Returns the rows switched."""
        if self._unseen:
            self._see_finished()
        if not self._to_switch:
            return 0
        switched = sum(self._switch_row(req) for req in reqs)
        self._expire()
        return switched

    def _see_finished(self) -> None:
        done = [(move, spec) for move, spec in self._unseen if move.done()]
        self._unseen = [pair for pair in self._unseen if pair not in done]
        self._to_switch.update({spec: move.result() for move, spec in done if move.exception() is None})

    def _switch_row(self, req) -> bool:
        old = req.grammar
        grammar = self._to_switch.get(req.sampling.grammar) if old is not None and old.backend == "llguidance" else None
        if req.finished or grammar is None or old.undo or old.is_terminated() or req in self._staying:
            return False
        new = self.backend.impl_named("outlines").matcher(grammar, req)
        if not (new.advance_all(req.output_ids[req.segment_start :]) and new.distance() <= new.budget()):
            self._staying.add(req)
            return False
        new.budget_closed = old.budget_closed  # the finish reason reads it: closed early to fit the budget
        req.grammar = new
        return True

    def _expire(self) -> None:
        """Keeps a finished move while a row of its grammar may still switch; walks only those grammars' rows."""
        for spec in list(self._to_switch):
            rows = weakref.WeakSet(r for r in self._rows.get(spec, ()) if _may_switch(r))
            if any(r not in self._staying for r in rows):
                self._rows[spec] = rows
            else:
                del self._to_switch[spec]
                self._rows.pop(spec, None)


def _may_switch(req) -> bool:
    return not req.finished and req.grammar is not None and req.grammar.backend == "llguidance"


def _log_from_spec(kind: str) -> None:
    log.info("auto: a %s grammar stays on llguidance: outlines cannot compile it to the same language", kind)


def _compiled_from_spec(compiled: Optional[Future]) -> bool:
    """Whether a grammar's finished llguidance compile was made from its spec (no outlines regex)."""
    return _succeeded(compiled) and compiled.result().regex is None


def _succeeded(fut: Optional[Future]) -> bool:
    """Whether `fut` exists, is done and did not raise."""
    return fut is not None and fut.done() and fut.exception() is None
