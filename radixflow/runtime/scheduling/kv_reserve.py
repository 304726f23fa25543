"""How many KV slots running requests may still take, so admission does not over-commit the pool.

Two rules (`--admission-rule`):

- `peak` (the default): each running request will take `left` more slots, one a decode step, and then
  give back what it computed itself (`freed` now, plus those `left`: into the free pool, or the radix
  tree's evictable part). Over the coming steps the pool's extra need rises while requests grow and
  drops as they end; admission takes a request only if that need at its highest, the newcomer's
  included, fits the free + evictable slots. A request that may stop early (EOS, stop ids or strings,
  a grammar) counts what it is expected to use of its remaining budget, from the lengths finished and
  running requests reached (stop_lengths.py); one that must run to `max_new_tokens` (ignore_eos, no
  stops) counts all of it. Budgets are clipped to CLIP_NEW_TOKENS (SGLang's estimate
  clips them too) and to the context length.
- `ratio`: SGLang's rule (`RatioGate`): the sum of the remaining budgets
  times a new-token ratio that decays from 0.7 to 0.1 over the decode steps and rises 0.1 a
  retraction. It bets that requests stop early; when they do not (ignore_eos benchmarks) the pool
  over-fills and decode retracts the newest requests, which recompute their KV if it was evicted.

Retraction stays the safety net under both (an early-stopping estimate can be wrong, and a request's
prompt computed by it but shared with a later request is counted as freed when the first ends).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import numpy as np

from radixflow.radix_cache.radix_tree import TreeNode
from radixflow.runtime.scheduling.req import Req
from radixflow.runtime.scheduling.stop_lengths import StopLengths
from radixflow.runtime.server_args import ADMISSION_RULES

if TYPE_CHECKING:
    from radixflow.radix_cache.radix_tree import MatchResult
    from radixflow.runtime.scheduling.scheduler import Scheduler

CLIP_NEW_TOKENS = 4096  # a budget counts as at most this many tokens


def may_stop_early(req: Req) -> bool:
    p = req.sampling
    stops = bool(p.stop_strs) or p.stop_patterns is not None or bool(p.stop_token_ids)
    return not p.ignore_eos or stops or req.grammar is not None


def budget_of(req: Req) -> int:
    return min(req.sampling.max_new_tokens, CLIP_NEW_TOKENS)


def peak_extra(freed: np.ndarray, left: np.ndarray) -> int:
    """The most slots, beyond those taken now, that requests take at once if request i takes one a step
    for `left[i]` steps and then gives back `freed[i] + left[i]`. At step t every request with
    left >= t holds t more and every earlier one has given back its `freed`: the need peaks at some
    request's last step. Sorted by `left`: O(n log n)."""
    if left.size == 0:
        return 0
    order = np.argsort(left, kind="stable")
    left, freed = left[order], freed[order]
    gone_before = np.cumsum(freed) - freed
    alive = left.size - np.arange(left.size)  # the first of equal `left`s counts them all: the maximum
    return max(int((left * alive - gone_before).max()), 0)


def unlocked_prefix(node: TreeNode) -> int:
    """Tokens of the path to `node` no request has locked: evictable now, not once a request locks it."""
    n = 0
    while node.parent is not None and node.lock_ref == 0:  # a locked node's ancestors are locked too
        n += len(node.key)
        node = node.parent
    return n


@dataclass
class KVReserve:
    """The scheduler's admission state: the rule, the early stoppers' lengths, and the last round's block."""

    rule: str = "peak"
    seq_limit: int = 1 << 30  # the most tokens a request may hold: the context length, or the KV pool's size + 1
    page_size: int = 1
    lengths: StopLengths = field(default_factory=StopLengths)
    retired: int = 0  # requests finished so far (any reason): a change admission's block waits for
    blocked: Optional[tuple] = None  # the scheduler state in which the head request last did not fit
    new_fraction: float = 1.0  # of its budget a request not started yet is expected to use (this round's)

    def __post_init__(self) -> None:
        assert self.rule in ADMISSION_RULES, self.rule

    def finished(self, req: Req) -> None:
        self.retired += 1
        reason = (req.finish_reason or {}).get("type")
        if reason in ("stop", "length") and may_stop_early(req) and budget_of(req) > 0:  # not aborted, not fixed
            self.lengths.observe(req.segment_len / budget_of(req))

    def outputs_left(self, max_new: np.ndarray, remaining: np.ndarray, seq_len: np.ndarray,
                     stoppable: np.ndarray) -> np.ndarray:
        """Slots the outputs still to come will take: the remaining budget clipped, estimated for early
        stoppers (stop_lengths.py; this also sets `new_fraction`)."""
        left = np.minimum(np.clip(remaining, 0, CLIP_NEW_TOKENS), np.maximum(self.seq_limit - seq_len, 0))
        budget = np.clip(max_new, 1, CLIP_NEW_TOKENS)
        used = np.clip((max_new - remaining) / budget, 0.0, 1.0)[stoppable]
        fractions = self.lengths.remaining(used)
        self.new_fraction = float(fractions[-1])
        left[stoppable] = np.minimum(left[stoppable], np.ceil(fractions[:-1] * budget[stoppable]).astype(np.int64))
        return left

    def running(self, reqs: list) -> "RoundNeed":
        """The need of the running requests (and a chunked one), for one admission round."""
        rows = np.array([(r.kv_len - r.admitted_prefix, r.seq_len - r.kv_len, r.sampling.max_new_tokens,
                          r.sampling.max_new_tokens - r.segment_len, r.seq_len, may_stop_early(r)) for r in reqs],
                        dtype=np.int64).reshape(-1, 6)  # fmt: skip
        left = rows[:, 1] + self.outputs_left(rows[:, 2], rows[:, 3], rows[:, 4], rows[:, 5].astype(bool))
        return RoundNeed(freed=np.maximum(rows[:, 0], 0), left=left + self.page_size - 1)

    def newcomer(self, req: Req, chunk: int, extend: int) -> tuple[int, int]:
        """(freed, left) of a request admitted with `chunk` of its `extend` uncomputed prompt tokens now
        (after `running` this round: its estimate of a new request)."""
        outputs = min(budget_of(req), max(self.seq_limit - req.seq_len, 0))
        if may_stop_early(req):
            outputs = min(outputs, int(np.ceil(self.new_fraction * budget_of(req))))
        return chunk, extend - chunk + outputs + self.page_size - 1


@dataclass
class RoundNeed:
    """One admission round's requests (running, then those admitted so far) as (freed, left) arrays."""

    freed: np.ndarray
    left: np.ndarray
    left_sum: int = field(init=False)  # sum of every `left`, the newcomers' too: the peak is at most this
    new: list = field(init=False, default_factory=list)  # (freed, left) admitted this round, not yet in the arrays

    def __post_init__(self) -> None:
        self.left_sum = int(self.left.sum())

    def fits(self, available: int, take: int, freed: int, left: int) -> bool:
        """Whether a request taking `take` slots now (its prefill, its prefix locked) and then (freed, left)
        keeps the peak within the `available` free + evictable slots. Most rounds have room for every
        `left` at once, which bounds the peak, and skip working it out."""
        if take + self.left_sum + left <= available:
            return True
        self._join()
        return take + peak_extra(np.append(self.freed, freed), np.append(self.left, left)) <= available

    def add(self, freed: int, left: int) -> None:
        self.new.append((freed, left))
        self.left_sum += left

    def _join(self) -> None:
        if self.new:
            new = np.array(self.new, dtype=np.int64)
            self.freed, self.left = np.append(self.freed, new[:, 0]), np.append(self.left, new[:, 1])
            self.new = []


class PeakGate:
    """The peak rule for one admission round: `reqs` are those holding or about to hold KV."""

    def __init__(self, sched: Scheduler, reqs: list):
        self.sched, self.reserve = sched, sched.reserve
        self.need = self.reserve.running(reqs)

    def fits(self, req: Req, match: MatchResult, chunk: int, extend: int) -> bool:
        take = chunk + unlocked_prefix(match.node)
        return self.need.fits(self.sched.kv.available_slots(), take, *self.reserve.newcomer(req, chunk, extend))

    def add(self, req: Req, chunk: int, extend: int) -> None:
        self.need.add(*self.reserve.newcomer(req, chunk, extend))

    def blocked(self) -> None:
        """The round's first request did not fit: no round finds otherwise until `blocked_state` changes."""
        self.reserve.blocked = blocked_state(self.sched)


class RatioGate:
    """SGLang's rule for one admission round: remaining budgets times the scheduler's new-token ratio."""

    def __init__(self, sched: Scheduler, reqs: list):
        self.sched, self.ratio = sched, sched.new_token_ratio
        left = sum(min(r.sampling.max_new_tokens - len(r.output_ids), CLIP_NEW_TOKENS) for r in sched.running)
        self.reserved = int(left * self.ratio)

    def fits(self, req: Req, match: MatchResult, chunk: int, extend: int) -> bool:
        need = chunk + self.sched.args.page_size + int(budget_of(req) * self.ratio)
        return self.sched.kv.available_slots() - self.reserved >= need

    def add(self, req: Req, chunk: int, extend: int) -> None:
        self.reserved += int(budget_of(req) * self.ratio)

    def blocked(self) -> None:
        """Nothing to remember: the ratio decays every step, so the next round may admit what this one did not."""


def admission_gate(sched: Scheduler, batch: list) -> PeakGate | RatioGate:
    """`batch`: a chunked request's last chunk, already allocated (it joins `running` after the pass)."""
    reqs = sched.running + [r for r, _ in batch]
    return (PeakGate if sched.reserve.rule == "peak" else RatioGate)(sched, reqs)


def blocked_state(sched: Scheduler) -> tuple:
    """What must change before a request that did not fit under the peak rule may fit: a request
    ending, joining, leaving or arriving. Between such changes the rule's peak moves with the pool
    (each step takes one slot a request and brings each request's end a step closer), so a new
    round would find the same answer."""
    return (len(sched.running), sched.reserve.retired, sched.stats.retractions, len(sched.waiting))
