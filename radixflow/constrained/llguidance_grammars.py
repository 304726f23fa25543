"""The llguidance grammar backend (PyPI `llguidance`): JSON schema, regex and Lark/GBNF
grammars compiled into an Earley parser over the model's tokens.

Compiling is building an `LLMatcher` and its first mask; a request gets a deep copy of
that compiled matcher. Masks are computed per step straight into the packed int32 bitmask
(llguidance drops the GIL while it does). Jump-forward uses llguidance's forced tokens.

Deep copies of one matcher share its lexer's lock, so a grammar's requests copy several
independently built matchers ("builds") in turn: the compile makes one, the compile pool more
once the grammar has had more requests than builds (llguidance_threads.py).

Budget-aware completion: llguidance has no distance to an accepting state, so each
request keeps a *closing path*, a completion found by search (closing_path.py) that fits
its remaining token budget. The compile finds the first one (its length is the grammar's
`min_tokens`, the max_new_tokens check's bound). After each token the path is followed (the
token was its next one) or kept (a tail of it still completes from the new state); otherwise
it is searched afresh, but only once the budget comes near (the search costs milliseconds, a
token's budget microseconds): far from the budget, tokens off the path are counted, and the
path stays a completion from the state where it was last verified. When the budget comes down
to the path's length, the mask allows only the path's next token. If no completion fits the
budget after a token, the matcher goes back to where the path was last verified, and the jump
hook cuts the output back there and puts the path's next token in place.
"""

from __future__ import annotations

from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Optional, Union

import numpy as np
import torch
from llguidance import LLMatcher, LLParserLimits

from radixflow.constrained.after_thinking import composed_parts
from radixflow.constrained.closing_hints import hint_strings
from radixflow.constrained.closing_path import ClosingSearch, Lead
from radixflow.constrained.llguidance_text import grammar_text, grammar_text_error
from radixflow.constrained.llguidance_threads import by_build, executor, max_builds
from radixflow.constrained.llguidance_tokenizer import ll_tokenizer
from radixflow.constrained.options import GrammarOptions, TokenizerInfo


MAX_CLOSING_TOKENS = 4096  # the compile's search for a shortest output gives up past this
# off-path tokens are checked by search once the budget is within VERIFY_MARGIN tokens of the
# path's length plus a GROWTH-th of the tokens since it was verified (a token off the path rarely
# lengthens the shortest completion by a whole token: the output moves on through the structure),
# or MAX_UNVERIFIED tokens on (the most a failed check undoes)
VERIFY_MARGIN = 8
GROWTH = 4
MAX_UNVERIFIED = 64


@dataclass(eq=False)
class LLGuidanceGrammar:
    kind: str
    text: str  # llguidance's grammar (JSON), as compiled
    compiled: LLMatcher  # fresh, first mask computed; requests take deep copies
    words: int
    closing: Optional[list] = None  # a shortest output found by search (None: none found)
    hints: tuple = ()  # sample strings as token lists, for the closing search (closing_hints.py)
    lead: Optional[Lead] = None  # a thinking block's end marker, which the closing search takes first (after_thinking.py)
    compile_s: float = 0.0
    build: Optional[Callable[[], LLMatcher]] = None  # builds another matcher of `text` (None: no more builds)
    builds: list = field(default_factory=list)  # independently built matchers of `text`, `compiled` first
    handed_out: int = 0  # requests given a copy so far
    building: Optional[Future] = None  # the one build job under way on the compile pool
    regex: Optional[str] = None  # the outlines regex it was compiled from (auto: the language a move keeps)

    def __post_init__(self):
        self.builds = self.builds or [self.compiled]

    def next_build(self, pool: Optional[Executor] = None) -> LLMatcher:
        """The build the next request deep-copies: the ready builds in turn. A grammar with
        fewer builds than requests so far (up to max_builds()) gets more, built one after another
        on `pool` (None: none) and used once ready: a first burst of requests mostly shares the
        compiled build, later requests spread over them all. Only the scheduler thread calls this
        (GrammarBackend.poll), so it takes no lock; the pool thread only appends to `builds`
        and clears `building`."""
        self.handed_out += 1
        cap = max_builds()
        if pool is not None and self.build is not None and self.building is None and len(self.builds) < min(cap, self.handed_out):
            self.building = pool.submit(self._build_more)
            self.building.add_done_callback(self._build_done)  # after the assignment: the build may be done already
        return self.builds[(self.handed_out - 1) % min(cap, len(self.builds))]

    def _build_more(self) -> None:
        """On the pool: builds until there are as many as requests so far (up to max_builds())."""
        while len(self.builds) < min(max_builds(), self.handed_out):
            m = self.build()
            if m.is_error():
                return
            self.builds.append(m)

    def wait_for_builds(self) -> int:
        """Blocks until the builds under way are made (benchmarks: before timing); how many there are."""
        pending = self.building
        if pending is not None:
            pending.result()
        return len(self.builds)

    def _build_done(self, _: Future) -> None:
        self.building = None

    @property
    def min_tokens(self) -> Optional[int]:
        """Tokens of the shortest output found (an upper bound on the true shortest)."""
        return None if self.closing is None else len(self.closing)


class LLGuidanceMatcher:
    """Per-request state (what `req.grammar` is), with GrammarMatcher's interface."""

    masks_cached = False  # each mask is computed afresh, straight into the bitmask row
    # a jump is a serial compute_ff_tokens per row and step, and its tokens are the ones the masks allow
    # anyway (outputs as long with jumps off): in a large overlapped batch it only costs (--jump-forward-max-batch)
    jumps_in_any_batch = False
    backend = "llguidance"  # the grammar backend whose jump hook serves this matcher

    def __init__(self, grammar: LLGuidanceGrammar, search: ClosingSearch, eos_ids: tuple, req=None, root: Optional[LLMatcher] = None):
        """`root`: the build to copy (default: the grammar's compiled one)."""
        self.grammar = grammar
        self.search = search
        self.req = req  # for the token budget; None = unlimited
        self.eos_ids = eos_ids
        root = grammar.compiled if root is None else root
        self.m = root.deep_copy()
        self.root_id = id(root)  # rows of one build are handed to llguidance's threads together (by_build)
        self.ended = False
        self.rejected_token = None
        self.budget_closed = False  # the budget left out tokens the grammar allowed
        # a completion within the budget from the state `since` tokens back; None: no budget tracking
        self.path = list(grammar.closing) if req is not None and grammar.closing is not None else None
        self.since = 0  # tokens consumed since the path was last verified
        self.unverified: list = []  # those tokens
        # a streamed request's shown tokens cannot be cut back: its path is verified after every token
        self.verify_each = req is not None and req.streamed
        self.undo = 0  # output tokens undone by a failed check: the jump hook cuts them, then path[0]

    # -- the scheduler's interface ----------------------------------------------------------------
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        assert bitmask.shape[1] == self.grammar.words, "the bitmask is sized for another vocabulary"
        if bitmask.is_cpu and bitmask.is_contiguous() and bitmask.dtype == torch.int32:
            self.m.unsafe_compute_mask_ptr(bitmask[row].data_ptr(), self.grammar.words * 4)
        else:
            bitmask[row].copy_(torch.from_numpy(self.current_mask()))
        self._apply_budget(bitmask, row)

    @staticmethod
    def fill_rows(pairs: list, bitmask: torch.Tensor) -> None:
        """(matcher, row) pairs into a contiguous CPU int32 bitmask, on llguidance's
        threads (the GIL is released while they run). All rows come from one backend, so
        one vocabulary: the first row's grammar stands for all."""
        assert bitmask.is_cpu and bitmask.is_contiguous() and bitmask.dtype == torch.int32
        words = bitmask.shape[1]
        assert pairs[0][0].grammar.words == words, "the bitmask is sized for another vocabulary"
        executor().unsafe_compute_mask_ptr([(m.m, row) for m, row in by_build(pairs)], bitmask.data_ptr(), words * 4, bitmask.shape[0])
        for m, row in pairs:
            if m.path is not None and not m.since:  # only a verified path can hold the budget (_budget_token)
                m._apply_budget(bitmask, row)

    def current_mask(self) -> np.ndarray:
        mask = np.zeros(self.grammar.words, dtype=np.int32)
        self.m.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        return mask

    @staticmethod
    def accept_rows(pairs: list) -> None:
        """(matcher, token) pairs: the tokens are consumed on llguidance's threads in one call
        (the GIL released), then each row's closing path is followed (inline when the token
        is the path's next one: most rows, most steps)."""
        batch = by_build([(m, t) for m, t in pairs if m._takes(t)])
        if not batch:
            return
        done = executor().consume_token_par([(m.m, t) for m, t in batch])
        for (m, t), ok in zip(batch, done):
            path = m.path
            if ok and path and not m.since and path[0] == t:
                del path[0]  # follow()'s on-path case without its budget lookup; the path is the matcher's own list
            else:
                m._consumed(t, ok)

    def accept_token(self, token: int) -> None:
        if self._takes(token):
            self._consumed(token, self.m.consume_token(token))

    def _takes(self, token: int) -> bool:
        """Whether `token` goes to the parser (not after the end, not EOS)."""
        if self.ended:
            return False
        if token in self.eos_ids:
            self.ended = True
            return False
        return True

    def _consumed(self, token: int, ok: bool) -> None:
        if not ok:
            self.ended = True
            self.rejected_token = token
        elif self.path is not None:
            self.follow([token], self.budget())  # a failed check is repaired by take_replacement

    def is_terminated(self) -> bool:
        return self.ended or self.m.is_stopped()

    @property
    def is_accepting(self) -> bool:
        return not self.m.is_error() and self.m.is_accepting()

    def error(self) -> Optional[str]:
        """Why this matcher failed, None if it did not. A matcher in error masks all but EOS, so
        its output ends looking complete: the stop checker asks this before a grammar row ends."""
        if self.m.is_error():
            return (self.m.get_error().strip().splitlines() or ["llguidance reported an error"])[0]
        if self.rejected_token is not None:
            return f"the grammar rejected token {self.rejected_token}"
        if self.ended and not self.m.is_accepting():  # the mask allows EOS only where the output is complete
            return "the output ended (EOS) before the grammar was complete"
        return None

    # -- budget-aware completion -------------------------------------------------------------------
    def budget(self) -> int:
        """Tokens the request may still add (the token being sampled included)."""
        return self.req.sampling.max_new_tokens - self.req.segment_len

    def _budget_token(self) -> Optional[int]:
        """The one token the budget leaves: the path's next token when the path takes the
        whole budget. None: no limit (on a complete output, its last token too: one that leaves it
        incomplete is replaced by EOS, the scheduler's repair before the length stop)."""
        if self.path is None or self.since:  # unverified: far from the budget
            return None
        left = self.budget()
        if self.path and len(self.path) >= left:
            return self.path[0]
        return None

    def _apply_budget(self, bitmask: torch.Tensor, row: int) -> None:
        """Every mask goes through here after llguidance fills it: at the budget, only the
        closing path's next token stays allowed (the row is indexed only then: a tensor view
        per row and step is most of this loop's cost)."""
        only = self._budget_token()
        if only is not None:
            self._allow_only(bitmask[row], only)

    def _allow_only(self, row: torch.Tensor, token: int) -> None:
        word, bit = divmod(token, 32)
        value = int(np.array([1 << bit], dtype=np.uint32).view(np.int32)[0])
        self.budget_closed = self.budget_closed or int(torch.count_nonzero(row)) > 1 or int(row[word]) != value
        row.zero_()
        row[word] = value

    def follow(self, tokens: list, left: int) -> bool:
        """Update the path after `tokens` were consumed, `left` tokens of budget remaining.
        False when no completion within `left` is found: the matcher is then back at the latest
        state that still has one (`_replay`), `self.undo` tokens earlier."""
        path, n = self.path, len(tokens)
        if not self.since and path[:n] == tokens:
            self.path = path[n:]
            return True
        self.since += n
        self.unverified += tokens
        if not self.verify_each and left > len(path) + self.since // GROWTH + VERIFY_MARGIN and self.since < MAX_UNVERIFIED:
            return True  # far from the budget: verified later
        found = self._completion(path, left)
        if found is not None:
            self.path, self.since, self.unverified = found, 0, []
            return True
        good, self.path = self._replay(left + n, len(self.unverified) - n)
        self.undo, self.since, self.unverified = self.since - good, 0, []
        return False

    def _completion(self, path: list, left: int) -> Optional[list]:
        """A completion within `left` from the matcher's state: a tail of `path` (the model may have taken a step
        of it its own way), else a search's. Near the budget, where the path is about to be forced, a tail is
        kept only if a search finds none shorter: in a free string or a loop an old tail still completes however
        long it is (fuzzing, session 30: 30 `a`s of a minLength path written after the string had its length)."""
        if self.m.is_accepting():  # complete already: an older path's tail (`0` after `\d+`) forced a token at the
            return []  # budget that streamed and non-streamed requests, verified at other times, did not share
        for tail in (path, path[1:], path[2:]):
            if len(tail) <= left and self._completes(tail):
                if len(tail) > 1 and len(tail) + VERIFY_MARGIN >= left:
                    shorter = self.search.find(self.m, len(tail) - 1, self.grammar.hints, self.grammar.lead)
                    return list(tail) if shorter is None else shorter
                return list(tail)
        return self.search.find(self.m, left, self.grammar.hints, self.grammar.lead)

    def _replay(self, left: int, earlier: int) -> tuple[int, list]:
        """After a failed check: the `earlier` unverified tokens (those before the ones just consumed) checked one at
        a time from the last verified state, as a streamed request's are, `left` being the budget after them. Leaves
        the matcher after the last of them that still has a completion within the budget and returns (how many
        that is, the completion): a repair then cuts back only to there, not to the last verified state (found by
        fuzzing: a non-streamed tool call lost its model-chosen `":` to a repair 13 tokens back, where a streamed
        one kept it)."""
        path = self.path
        self.m.rollback(self.since)
        for k, token in enumerate(self.unverified[:earlier]):
            took = self.m.consume_token(token)  # not inside the assert: it must run under python -O too
            assert took, "a token the matcher took before"
            step = path[1:] if path[:1] == [token] else self._completion(path, left + earlier - k - 1)
            if step is None:
                self.m.rollback(1)
                return k, path
            path = step
        return earlier, path

    def _completes(self, tokens: list) -> bool:
        done = self.m.try_consume_tokens(tokens)
        ok = done == len(tokens) and self.m.is_accepting()
        self.m.rollback(done)
        return ok

    def take_replacement(self) -> Optional[tuple]:
        """After a failed check: (output tokens to cut, the token to put in their place: the
        path's next one, or EOS where the path's state was already complete)."""
        if not self.undo:
            return None
        back, self.undo = self.undo, 0
        self.budget_closed = True
        if not self.path:
            self.ended = True
            return back, self.eos_ids[0]
        token, self.path = self.path[0], self.path[1:]
        self.m.consume_token(token)
        return back, token


class LLGuidanceGrammars:
    name = "llguidance"

    def __init__(self, info: TokenizerInfo):
        self.info = info
        self.tokenizer = ll_tokenizer(info)
        self.words = (info.vocab_size + 31) // 32
        self.limits = LLParserLimits()
        self.search = ClosingSearch(info)

    def compile(self, kind: str, spec: Any, options: GrammarOptions, timeout_s: float = 0.0,
                regex: Optional[str] = None) -> LLGuidanceGrammar:
        """`timeout_s` is unused: llguidance builds its lexer lazily and bounds each step's work.
        `regex`: compile this regex (the one the outlines backend makes of the spec) instead of the
        spec itself, so both backends accept one language (auto, for a grammar that may move)."""
        text = grammar_text(kind, spec, options) if regex is None else LLMatcher.grammar_from_regex(regex)
        m = _built(self.tokenizer, text, self.limits, self.words)
        if m.is_error():
            raise grammar_text_error(kind, spec, m.get_error())
        ids = partial(self.info.tokenizer.encode, add_special_tokens=False)
        parts = composed_parts(kind, spec)
        own = (parts.kind, parts.spec) if parts else (kind, spec)  # sample strings from the grammar after a block
        hints = tuple(sorted((ids(h) for h in hint_strings(*own)), key=len))
        lead = self.search.lead(m, ids(parts.opening), ids(parts.end)) if parts else None
        closing = self.search.find(m, MAX_CLOSING_TOKENS, hints, lead)
        build = partial(_built, self.tokenizer, text, self.limits, self.words)
        return LLGuidanceGrammar(kind, text, m, self.words, closing=closing, hints=hints, lead=lead, build=build,
                                 regex=regex)  # fmt: skip

    def matcher(self, grammar: LLGuidanceGrammar, req=None, pool: Optional[Executor] = None) -> LLGuidanceMatcher:
        """`pool`: where the grammar's further builds are made (None: it keeps the builds it has)."""
        return LLGuidanceMatcher(grammar, self.search, self.info.eos_ids, req, grammar.next_build(pool))

    def jump(self, matcher: LLGuidanceMatcher, req, first: bool = False, forced: bool = True,
             limit: Optional[int] = None, cut: bool = True) -> Union[list, tuple]:
        """After a failed budget check, the output cut back and a replacement ((keep, [token])),
        else the tokens the grammar forces next (`forced`: jump-forward is on), as many as the
        budget allows, and at most `limit`. `cut` is moot: these jumps only append, and a budget
        repair is taken regardless."""
        swap = matcher.take_replacement()
        if swap is not None:
            return (len(req.output_ids) - swap[0], [swap[1]])
        if not forced:  # the caller checked that the matcher is not terminated
            return []
        room = req.sampling.max_new_tokens - req.segment_len
        most = room - (1 if first else 0) if limit is None else min(room - (1 if first else 0), limit)
        tokens = matcher.m.compute_ff_tokens()[: max(most, 0)]
        if not tokens or not matcher.m.consume_tokens(tokens):
            return []
        if matcher.path is not None and not matcher.follow(tokens, room - len(tokens)):
            matcher.undo -= len(tokens)  # forced, yet no completion would fit after them; never output
            if matcher.undo:  # earlier unverified outputs go too
                back, token = matcher.take_replacement()
                return (len(req.output_ids) - back, [token])
            return []
        return tokens


def _built(tokenizer, text: str, limits: LLParserLimits, words: int) -> LLMatcher:
    """A matcher of `text` with its first mask computed (part of the compile)."""
    m = LLMatcher(tokenizer, text, log_level=0, limits=limits)
    if not m.is_error():
        probe = np.zeros(words, dtype=np.int32)
        m.unsafe_compute_mask_ptr(probe.ctypes.data, probe.nbytes)
        m.reset()
    return m
