"""The peak admission rule (kv_reserve.py): its arithmetic against a step-by-step count, its decisions
against a small pool, the observed stop ratio, and an engine that must not retract on an ignore_eos
workload the ratio rule over-commits."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from radixflow.radix_cache.memory_pool import PageAllocator, ReqToTokenPool
from radixflow.radix_cache.radix_tree import RadixCache
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.scheduling import admission, kv_reserve, stop_lengths
from radixflow.runtime.scheduling.kv_audit import SchedulerStats
from radixflow.runtime.scheduling.kv_manager import KVManager
from radixflow.runtime.scheduling.kv_reserve import KVReserve, peak_extra, unlocked_prefix
from radixflow.runtime.scheduling.stop_lengths import StopLengths
from radixflow.runtime.scheduling.req import Req

TINY = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "configs", "smollm2-tiny.json")


def stepped_peak(freed: list, left: list) -> int:
    """The same need counted step by step: at step t a request with left >= t takes its t-th slot, and
    one that took its last slot before t has given back what it held."""
    peak = 0
    for t in range(1, max(left, default=0) + 1):
        need = sum(t if r >= t else -f for f, r in zip(freed, left))
        peak = max(peak, need)
    return peak


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 30)), max_size=12))
def test_peak_extra_is_the_highest_step_by_step_need(reqs):
    freed, left = [f for f, _ in reqs], [r for _, r in reqs]
    assert peak_extra(np.array(freed, dtype=np.int64), np.array(left, dtype=np.int64)) == stepped_peak(freed, left)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 30)), max_size=12),
       st.lists(st.tuples(st.integers(0, 60), st.integers(0, 50), st.integers(0, 30)), min_size=1, max_size=6),
       st.integers(0, 300))
def test_round_need_fits_as_the_exact_peak_says(running, newcomers, available):
    """RoundNeed skips the peak where every `left` at once fits: its answers are the exact rule's."""
    need = kv_reserve.RoundNeed(np.array([f for f, _ in running], dtype=np.int64),
                                np.array([r for _, r in running], dtype=np.int64))
    held = list(running)
    for take, freed, left in newcomers:
        exact = take + stepped_peak([f for f, _ in held] + [freed], [r for _, r in held] + [left]) <= available
        assert need.fits(available, take, freed, left) == exact
        need.add(freed, left)
        held.append((freed, left))


def small_scheduler(pool: int, rule: str, running: list, waiting: list, ratio: float = 0.7):
    alloc = PageAllocator(pool + 1, 1)
    tree = RadixCache(alloc, 1)
    kv = KVManager(SimpleNamespace(allocator=alloc, page_size=1), ReqToTokenPool(8, 256, "cpu"), tree)
    for req in running:  # prefilled, its last sampled token pending
        assert kv.admit(req, tree.match_prefix([])) and kv.alloc(req, req.seq_len - 1) is not None
        req.kv_len = req.seq_len - 1
    args = SimpleNamespace(chunked_prefill_size=0, max_prefill_tokens=4096, schedule_policy="fcfs",
                           max_running_requests=8, page_size=1, resolve_in_batch_threshold=lambda device: 32)  # fmt: skip
    return SimpleNamespace(args=args, waiting=list(waiting), running=list(running), chunked=None, tree=tree, kv=kv,
                           device="cpu",
                           stats=SchedulerStats(), new_token_ratio=ratio, num_running=len(running),
                           reserve=KVReserve(rule))  # fmt: skip


def fixed_length(rid: str, prompt: int, out: int, done: int = 0) -> Req:
    return Req(rid, list(range(1000, 1000 + prompt)), SamplingParams(max_new_tokens=out, ignore_eos=True),
               output_ids=[7] * done)  # fmt: skip


def test_peak_rule_refuses_what_would_overfill_the_pool_and_ratio_admits_it():
    """A 100-slot pool; one request holds 40 slots (39 computed, 1 pending) and will take 31 more. A
    10-token prompt with 30 to generate would need 10 now and, 30 steps on, both hold 30 more: 70 > 61
    free. The ratio rule (0.7) reserves 28 for the running one and 21 for it: it fits there."""
    def sched(rule):
        return small_scheduler(100, rule, [fixed_length("run", 20, 50, done=20)], [fixed_length("new", 10, 30)])

    peak, ratio = sched("peak"), sched("ratio")
    assert peak.kv.available_slots() == 61
    assert admission.form_extend_batch(peak) == [] and [r.rid for r in peak.waiting] == ["new"]
    assert [(r.rid, n) for r, n in admission.form_extend_batch(ratio)] == [("new", 10)]


def test_peak_rule_admits_what_fits_at_the_peak():
    """The same, with 20 to generate: at step 20 both hold 20 more (40), then the newcomer gives its 30
    back; 10 now + 40 <= 61."""
    sched = small_scheduler(100, "peak", [fixed_length("run", 20, 50, done=20)], [fixed_length("new", 10, 20)])
    assert [(r.rid, n) for r, n in admission.form_extend_batch(sched)] == [("new", 10)]


def test_a_blocked_round_is_not_recomputed_until_something_changes(monkeypatch):
    sched = small_scheduler(100, "peak", [fixed_length("run", 20, 50, done=20)], [fixed_length("new", 10, 30)])
    rounds = []
    real = kv_reserve.KVReserve.running
    monkeypatch.setattr(kv_reserve.KVReserve, "running", lambda self, reqs: rounds.append(len(reqs)) or real(self, reqs))
    assert admission.form_extend_batch(sched) == [] and rounds == [1]
    assert admission.form_extend_batch(sched) == [] and rounds == [1]  # the same state: no new round
    sched.reserve.finished(fixed_length("other", 1, 1))  # a request ended somewhere
    assert admission.form_extend_batch(sched) == [] and rounds == [1, 1]


def finished_req(max_new: int, used: int, ignore_eos: bool = False, reason: str = "stop") -> Req:
    req = Req("d", [1], SamplingParams(max_new_tokens=max_new, ignore_eos=ignore_eos), output_ids=[5] * used)
    req.finish({"type": reason, "message": "x"} if reason == "abort" else {"type": reason, "length": used})
    return req


def test_early_stoppers_count_what_finished_ones_used_and_fixed_ones_count_in_full():
    reserve = KVReserve("peak")
    reserve.running([])
    assert reserve.new_fraction == 1.0  # nothing seen yet: budgets in full
    for _ in range(200):
        reserve.finished(finished_req(100, 40))
    reserve.finished(finished_req(100, 1, reason="abort"))  # neither an abort nor a fixed length counts
    reserve.finished(finished_req(100, 1, ignore_eos=True, reason="length"))
    assert reserve.retired == 202 and reserve.lengths.seen == 200
    reserve.running([])
    assert 0.39 < reserve.new_fraction < 0.42
    may_stop = Req("f", [1, 2], SamplingParams(max_new_tokens=100))
    fixed = Req("x", [1, 2], SamplingParams(max_new_tokens=100, ignore_eos=True))
    assert reserve.newcomer(may_stop, 2, 2) in ((2, 41), (2, 42)) and reserve.newcomer(fixed, 2, 2) == (2, 100)


def test_short_requests_finishing_first_do_not_make_the_estimate_short():
    """Half the requests stop at 8% of their budget, half are still running at 10%: a mean over the
    finished would say 8%; counting the running as still alive says about half for a new request, and
    nearly all of the rest for a running one."""
    lengths = StopLengths()
    for _ in range(100):
        lengths.observe(0.08)
    est = lengths.remaining(np.full(100, 0.1))
    assert 0.5 < est[-1] < 0.6 and np.all(est[:-1] > 0.88)
    assert StopLengths().remaining(np.array([0.5]))[0] == 0.5  # nothing finished: the rest of the budget in full


def test_the_estimate_has_a_floor():
    lengths = StopLengths()
    for _ in range(500):
        lengths.observe(0.001)
    assert lengths.remaining(np.empty(0))[-1] == stop_lengths.FLOOR and lengths.done.size == stop_lengths.WINDOW


def test_unlocked_prefix_counts_only_what_no_request_locks():
    alloc = PageAllocator(64, 1)
    tree = RadixCache(alloc, 1)
    tree.insert(list(range(10)), alloc.alloc(10))
    tree.insert(list(range(6)) + [50, 51], alloc.alloc(8))  # splits [0..10) at 6
    tree.inc_lock(tree.match_prefix(list(range(6)) + [50, 51]).node)
    assert unlocked_prefix(tree.match_prefix(list(range(10))).node) == 4  # [6..10): the locked [0..6) is not evictable
    assert unlocked_prefix(tree.match_prefix(list(range(6))).node) == 0


def test_fixed_length_requests_on_a_tight_pool_are_not_retracted_and_give_the_same_tokens():
    """40 requests of 50 prompt tokens and 50 outputs (ignore_eos) on a pool of a third of their tokens: the
    ratio rule admits more than fits and retracts; the peak rule does not, and the outputs agree."""
    import radixflow
    from radixflow.model_files import resolve_model

    prompts = [[100 + (i * 37 + j * 11) % 40000 for j in range(50)] for i in range(40)]
    outs, retractions = {}, {}
    for rule in ("ratio", "peak"):
        eng = radixflow.Engine(TINY, load_format="dummy", tokenizer_path=resolve_model(None).path, device="cpu",
                               dtype="float32", max_total_tokens=1320, admission_rule=rule, chunked_prefill_size=512)  # fmt: skip
        try:
            res = eng.generate(input_ids=prompts, sampling_params=dict(max_new_tokens=50, ignore_eos=True, temperature=0.0))
            outs[rule], retractions[rule] = [r["output_ids"] for r in res], eng.scheduler.stats.retractions
        finally:
            eng.shutdown()
    assert retractions["ratio"] > 0 and retractions["peak"] == 0
    assert outs["peak"] == outs["ratio"]
