"""Per-request grammar state: what `req.grammar` is.

The scheduler calls `fill_bitmask` before sampling, `accept_token` after, and
`is_terminated` in the stop checker. The matcher reads the request's remaining token
budget (`max_new_tokens - segment_len`) itself, so when the budget comes down to the
distance to an accepting state, only tokens that keep acceptance within reach are allowed.
`budget_closed` records that this happened: the output was closed early to fit the budget.
"""

from __future__ import annotations

import numpy as np
import torch

from radixflow.constrained.fsm import CompiledGrammar


class GrammarMatcher:
    masks_cached = True  # current_mask() returns arrays cached per FSM state (the sampler keys bias rows by them)
    # a jump reads forced bytes cached per state and re-tokenizes them (cached per text): cheap, and it can
    # shorten the output (the tokenizer's own split of the forced text), so it is taken in any batch
    jumps_in_any_batch = True
    backend = "outlines"  # the grammar backend whose jump hook serves this matcher
    undo = 0  # a budget repair due (llguidance's): each mask here keeps a completion within the budget

    def __init__(self, grammar: CompiledGrammar, req=None):
        self.grammar = grammar
        self.req = req  # for the token budget; None = unlimited
        self.guide = grammar.new_guide()
        self.ended = False  # EOS accepted, or a token the FSM did not allow
        self.rejected_token = None
        self.budget_closed = False  # the budget left out tokens the grammar allowed

    # -- the scheduler's interface ----------------------------------------------------------------
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        mask = self.current_mask()
        if bitmask.is_cpu:  # a numpy row copy costs a third of torch's copy_
            bitmask.numpy()[row] = mask
        else:
            bitmask[row].copy_(torch.from_numpy(mask))

    @staticmethod
    def fill_rows(pairs: list, bitmask: torch.Tensor) -> None:
        """(matcher, row) pairs into a CPU bitmask: each cached mask copied once into its row."""
        out = bitmask.numpy()
        for m, row in pairs:
            out[row] = m.current_mask()

    @staticmethod
    def accept_rows(pairs: list) -> None:
        """(matcher, token) pairs: each FSM step is a dictionary lookup, so one row at a time."""
        for m, token in pairs:
            m.accept_token(token)

    def accept_token(self, token: int) -> None:
        if self.ended:
            return
        if token in self.grammar.vocab.eos_ids:
            self.ended = True
            return
        try:
            self.guide.advance(token, return_tokens=False)
        except ValueError:  # only reachable if a caller bypassed the mask
            self.ended = True
            self.rejected_token = token

    def is_terminated(self) -> bool:
        return self.ended or bool(self.grammar.terminal[self.grammar.dense(self.state)])

    def error(self) -> "str | None":
        """Why this matcher failed (a token its mask did not allow), None if it did not."""
        return None if self.rejected_token is None else f"the grammar rejected token {self.rejected_token}"

    # -- helpers ---------------------------------------------------------------------------------
    @property
    def state(self) -> int:
        return self.guide.get_state()

    @property
    def is_accepting(self) -> bool:
        return bool(self.grammar.final[self.grammar.dense(self.state)])

    def distance(self) -> int:
        """Fewest tokens from here to an accepted output."""
        return int(self.grammar.dist[self.grammar.dense(self.state)])

    def budget(self) -> int:
        if self.req is None:
            return 1 << 30
        return self.req.sampling.max_new_tokens - self.req.segment_len

    def current_mask(self) -> np.ndarray:
        g = self.grammar
        within = self.budget() - 1  # tokens left after this one
        if within < g.max_next[g.dense(self.state)]:
            self.budget_closed = self.budget_closed or g.budget_narrows(self.state, within)
            return g.budget_mask(self.state, within)
        return g.full_mask(self.guide)

    def advance_all(self, tokens: list) -> bool:
        """Accept `tokens` (all allowed, checked first); False and no change otherwise."""
        if self.grammar.walk(self.state, tokens) is None:
            return False
        for t in tokens:
            self.guide.advance(t, return_tokens=False)
        return True

    def rollback(self, n: int) -> None:
        if n:
            self.guide.rollback_state(n)
