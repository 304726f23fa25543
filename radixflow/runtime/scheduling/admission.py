"""Admission: which waiting requests the next extend pass prefills, and how much of each
(how much KV the running requests may still take: kv_reserve.py).

Functions over the scheduler's queues (`waiting`, `running`, `chunked`) and KV manager;
the scheduler calls `form_extend_batch` once per step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixflow.radix_cache.radix_tree import MatchResult
from radixflow.runtime.scheduling.kv_reserve import admission_gate, blocked_state
from radixflow.runtime.scheduling.req import Req, ReqState

if TYPE_CHECKING:
    from radixflow.runtime.scheduling.scheduler import Scheduler

SCORING_SHARE_MIN = 16  # a prompt-only request also waits for one sharing this many, if they are half or more of its work
LPM_MAX_WAITING = 128  # above this, lpm falls back to fcfs (matching every request costs)


def match_limit(req: Req) -> int:
    """Longest prefix we may reuse: at least one token must be computed (for logits),
    and input logprobs need the logits of the positions they cover."""
    limit = req.seq_len - 1
    if req.needs_input_logprobs:
        limit = min(limit, max(req.input_logprob_next - 1, 0))
    return limit


def ordered_waiting(sched: Scheduler) -> list[tuple[Req, object]]:
    pairs = [(r, None) for r in sched.waiting]
    if sched.args.schedule_policy == "lpm" and len(sched.waiting) <= LPM_MAX_WAITING and not sched.tree.disable:
        pairs = [(r, sched.kv.match_waiting(r, match_limit(r))) for r in sched.waiting]
        pairs.sort(key=lambda p: (-p[1].length, p[0].arrival_seq))
    else:
        pairs.sort(key=lambda p: p[0].arrival_seq)
    return pairs


def form_extend_batch(sched: Scheduler) -> list[tuple[Req, int]]:
    """Pick requests to prefill now; returns (req, tokens this pass) pairs, slots allocated."""
    budget = sched.args.chunked_prefill_size if sched.args.chunked_prefill_size > 0 else sched.args.max_prefill_tokens
    budget = min(budget, sched.args.max_prefill_tokens)
    batch: list[tuple[Req, int]] = []
    if sched.chunked is not None:
        req = sched.chunked
        n = min(req.seq_len - req.kv_len, budget)
        if sched.kv.alloc(req, n) is None:
            return []  # wait for decode to finish requests; nothing else can be admitted
        batch.append((req, n))
        budget -= n
        if req.kv_len + n < req.seq_len:
            return batch
        sched.chunked = None
    if not sched.waiting or budget <= 0:
        return batch
    if sched.reserve.blocked == blocked_state(sched) and not batch:
        return batch  # nothing changed since the head request did not fit
    sched.reserve.blocked = None
    in_batch = InBatchTails(sched.args.resolve_in_batch_threshold(sched.device))
    gate = admission_gate(sched, batch)
    admitted = set()
    for req, match in ordered_waiting(sched):
        if sched.num_running + len(batch) >= sched.args.max_running_requests or budget <= 0:  # batch: a finished chunk too
            break
        if match is None or not sched.tree.is_attached(match.node):  # an earlier alloc may have evicted it
            match = sched.kv.match_waiting(req, match_limit(req))
        if not sched.tree.disable and not fresh_enough(req, match, in_batch):
            continue
        extend = req.seq_len - match.length
        chunk = min(extend, budget)
        if chunk < extend and sched.args.chunked_prefill_size <= 0 and batch:
            break
        if chunk < extend and sched.args.chunked_prefill_size <= 0:
            chunk = extend
        if (batch or sched.running) and not gate.fits(req, match, chunk, extend):
            if not batch:
                gate.blocked()
            break
        if not sched.kv.admit(req, match):
            break
        if sched.kv.alloc(req, chunk) is None:
            sched.kv.release(req, cache=False)
            break
        if req.num_retractions == 0:
            req.cached_tokens = min(match.length, len(req.origin_input_ids))  # a grammar's forced first tokens aside
        sched.stats.cached_tokens += match.length
        sched.stats.prompt_tokens += req.seq_len
        admitted.add(id(req))
        req.state = ReqState.RUNNING
        batch.append((req, chunk))
        budget -= chunk
        gate.add(req, chunk, extend)
        if chunk < extend:
            sched.chunked = req
            break
    sched.waiting = [r for r in sched.waiting if id(r) not in admitted]
    return batch


class InBatchTails:
    """The uncached tokens of the requests admitted this round, one token trie (nested dicts) per cached
    node they continue. Two requests that share uncached tokens continue the same node: the tree's match
    of the tokens they share is their match, up to the same node. So a request is compared with the
    others' tails only, never walked again down its cached few-shot prefix, and only as deep as the
    rules look: past `threshold` shared tokens (ServerArgs.in_batch_prefix_threshold) a request waits
    however many more it shares."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.depth = max(threshold, SCORING_SHARE_MIN) + 1
        self.tries: dict = {}  # TreeNode -> {token: {token: ...}}

    def shared(self, match: MatchResult, tail: list) -> int:
        """Tokens `tail` (at most `depth`: fresh_enough cuts it) shares with an admitted request's."""
        level, n = self.tries.get(match.node), 0
        if level is None:
            return 0
        for tok in tail:
            level = level.get(tok)
            if level is None:
                break
            n += 1
        return n

    def add(self, match: MatchResult, tail: list) -> None:
        level = self.tries.setdefault(match.node, {})
        for tok in tail:
            level = level.setdefault(tok, {})


def fresh_enough(req: Req, match: MatchResult, in_batch: InBatchTails) -> bool:
    """In-batch prefix sharing: if this request shares a long uncached prefix with one
    already admitted this round, wait a round and reuse its KV instead. A prompt-only
    request (a select's scoring) has no first token to delay, so it also waits when the
    shared part is at least SCORING_SHARE_MIN tokens and at least half of what it would
    compute: a select's choices after a short uncached context would otherwise each
    recompute it (a few tokens, such as the text between a gen and a select, cost less
    to recompute than a pass of latency). Only the reusable part counts (up to
    `match_limit`): tokens whose input logprobs are wanted are computed again anyway, so
    waiting for them would gain nothing and cost a pass."""
    tail = req.token_range(match.length, min(match_limit(req), match.length + in_batch.depth))
    shared = in_batch.shared(match, tail)
    if shared > in_batch.threshold:
        return False
    rest = req.seq_len - match.length
    if req.sampling.max_new_tokens == 0 and shared >= SCORING_SHARE_MIN and 2 * shared >= rest:
        return False
    in_batch.add(match, tail)
    return True
