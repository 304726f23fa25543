"""Admission against a small KV pool, on the CPU without a model: the scheduler's state is a
stand-in holding the real KV manager, radix tree and pools."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixflow.radix_cache.memory_pool import PageAllocator, ReqToTokenPool
from radixflow.radix_cache.radix_tree import RadixCache
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.scheduling import admission
from radixflow.runtime.scheduling.kv_audit import SchedulerStats
from radixflow.runtime.scheduling.kv_manager import KVManager
from radixflow.runtime.scheduling.kv_reserve import KVReserve
from radixflow.runtime.scheduling.req import Req


def test_a_match_evicted_by_an_earlier_admission_is_matched_again():
    """lpm matches every waiting request before admitting any. The first admitted here needs
    more slots than are free, so its allocation evicts the only unlocked leaf: the prefix the
    second request had matched. The second must not be admitted with those freed slots (nor
    lock the detached node); matched again it has no cached prefix and no room, so it waits."""
    alloc = PageAllocator(65, 1)
    tree = RadixCache(alloc, 1)
    second_prefix, first_prefix = list(range(100, 110)), list(range(200, 212))
    for key in (second_prefix, first_prefix):  # the second's prefix is the older leaf
        tree.insert(key, alloc.alloc(len(key)))
    free = alloc.num_free_pages
    kv = KVManager(SimpleNamespace(allocator=alloc, page_size=1), ReqToTokenPool(4, 128, "cpu"), tree)
    first = Req("first", first_prefix + list(range(300, 303 + free)), SamplingParams(max_new_tokens=1), arrival_seq=1)
    second = Req("second", second_prefix + [400, 401], SamplingParams(max_new_tokens=1), arrival_seq=0)
    args = SimpleNamespace(chunked_prefill_size=0, max_prefill_tokens=4096, schedule_policy="lpm",
                           max_running_requests=8, page_size=1, resolve_in_batch_threshold=lambda device: 32)  # fmt: skip
    sched = SimpleNamespace(args=args, waiting=[second, first], running=[], chunked=None, tree=tree, kv=kv, device="cpu",
                            stats=SchedulerStats(), new_token_ratio=0.0, num_running=0, reserve=KVReserve())  # fmt: skip

    batch = admission.form_extend_batch(sched)

    assert batch == [(first, free + 3)]
    assert tree.match_prefix(second_prefix).length == 0  # evicted, as the test intends
    assert sched.waiting == [second] and second.req_pool_idx is None and second.last_node is None
    assert tree.protected_size == len(first_prefix)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=12), st.lists(st.integers(0, 9), max_size=12),
       st.integers(0, 30), st.integers(0, 30))  # fmt: skip
def test_token_range_is_the_slice_of_fill_ids(prompt, outputs, start, end):
    req = Req("r", prompt, SamplingParams(max_new_tokens=1), output_ids=outputs)
    assert req.token_range(start, end) == req.fill_ids[start:end]


def test_two_requests_computing_one_prefix_keep_the_first_ones_slots_and_free_the_duplicates():
    """Both requests found [1, 2, 3] cached and computed the same next 3 tokens (admitted in one
    pass). Each hands its KV to the tree from its locked node, [1, 2, 3]: the second finds the
    first's tokens cached, frees its own slots for them and its row now holds the tree's; on release
    every slot is either free or the tree's, once."""
    alloc = PageAllocator(33, 1)
    tree = RadixCache(alloc, 1)
    tree.insert([1, 2, 3], alloc.alloc(3))
    kv = KVManager(SimpleNamespace(allocator=alloc, page_size=1), ReqToTokenPool(4, 64, "cpu"), tree)
    reqs = [Req(f"r{i}", [1, 2, 3, 4, 5, 6, 7 + i], SamplingParams(max_new_tokens=4)) for i in range(2)]
    for req in reqs:
        assert kv.admit(req, tree.match_prefix(req.token_range(0, 6))) and req.tree_len == 3
        kv.alloc(req, 3)
        req.kv_len = 6
    second_own = kv.req_to_token.read(reqs[1].req_pool_idx, 6)[3:]
    for req in reqs:
        kv.cache_unfinished(req)
    first_slots = kv.req_to_token.read(reqs[0].req_pool_idx, 6)
    assert torch.equal(kv.req_to_token.read(reqs[1].req_pool_idx, 6), first_slots)
    assert set(second_own.tolist()) <= set(alloc.free_pages.tolist())  # page size 1: pages are slots
    assert reqs[1].tree_len == 6 and reqs[1].last_node is reqs[0].last_node
    for req in reqs:  # the second token each: its KV joins the tree as a leaf of the shared path
        kv.alloc(req, 2)
        req.output_ids.append(8)
        req.kv_len = 8
        kv.release(req)
    assert tree.match_prefix([1, 2, 3, 4, 5, 6, 7, 8]).length == 8 and tree.match_prefix([1, 2, 3, 4, 5, 6, 8, 8]).length == 8
    assert alloc.num_free_slots + tree.total_size == alloc.capacity_slots
    assert tree.protected_size == 0 and torch.equal(tree.match_prefix([1, 2, 3, 4, 5, 6]).slots, first_slots)


def test_release_copies_only_the_requests_own_slots_once():
    """A finished request past a long locked prefix: its row is read once, and only past `tree_len`
    (the prefix's slots are the tree's already); the tree and the free list end as before."""
    alloc = PageAllocator(65, 1)
    tree = RadixCache(alloc, 1)
    prefix = list(range(100, 140))
    tree.insert(prefix, alloc.alloc(len(prefix)))
    kv = KVManager(SimpleNamespace(allocator=alloc, page_size=1), ReqToTokenPool(4, 64, "cpu"), tree)
    req = Req("r", prefix + [1, 2], SamplingParams(max_new_tokens=4))
    assert kv.admit(req, tree.match_prefix(req.token_range(0, 42))) and req.tree_len == 40
    kv.alloc(req, 2)
    req.output_ids.append(3)
    req.kv_len = 43
    kv.alloc(req, 1)
    reads, read = [], kv.req_to_token.read
    kv.req_to_token.read = lambda row, end, start=0: reads.append((start, end)) or read(row, end, start)
    kv.release(req)
    assert reads == [(40, 43)]
    assert tree.match_prefix(prefix + [1, 2, 3]).length == 43 and tree.protected_size == 0
    assert alloc.num_free_slots + tree.total_size == alloc.capacity_slots


def test_a_waiting_requests_match_is_reused_until_the_tree_grows_under_it_or_loses_it():
    """lpm orders the waiting queue by match on every step. A request's match is kept while the tree
    gives it again (no walk over its prompt), and taken again once something is added under its
    node (it may be longer now: it must not be admitted with the stale, shorter one) or its node
    is evicted."""
    alloc = PageAllocator(200, 1)
    tree = RadixCache(alloc, 1)
    prompt = list(range(100, 140))
    tree.insert(prompt[:10], alloc.slots_of(alloc.alloc(10)))
    kv = KVManager(SimpleNamespace(allocator=alloc, page_size=1), ReqToTokenPool(4, 128, "cpu"), tree)
    req = Req("r", prompt, SamplingParams(max_new_tokens=1))
    args = SimpleNamespace(chunked_prefill_size=0, max_prefill_tokens=4096, schedule_policy="lpm",
                           max_running_requests=1, page_size=1, resolve_in_batch_threshold=lambda device: 32)  # fmt: skip
    sched = SimpleNamespace(args=args, waiting=[req], running=[], chunked=None, tree=tree, kv=kv, device="cpu",
                            stats=SchedulerStats(), new_token_ratio=0.0, num_running=1, reserve=KVReserve())  # fmt: skip
    walks = []
    match_prefix = tree.match_prefix
    tree.match_prefix = lambda key: walks.append(len(key)) or match_prefix(key)

    assert admission.form_extend_batch(sched) == [] and walks == [39]  # full: matched, not admitted
    assert admission.form_extend_batch(sched) == [] and walks == [39]  # unchanged tree: no walk
    tree.insert(prompt[:5] + [7, 7], alloc.slots_of(alloc.alloc(7)))  # splits its node: still its match
    assert admission.form_extend_batch(sched) == [] and walks == [39]
    tree.insert(prompt[:30], torch.cat([match_prefix(prompt[:10]).slots, alloc.slots_of(alloc.alloc(20))]))
    sched.num_running = 0
    assert admission.form_extend_batch(sched) == [(req, 10)] and walks == [39, 39]
    assert req.cached_tokens == 30 and req.waiting_match is None

    other = Req("o", prompt[:10] + [5, 5, 5], SamplingParams(max_new_tokens=1))
    assert kv.match_waiting(other, 12).length == 10
    kv.release(req, cache=False)
    sched.running, sched.waiting, sched.num_running = [], [other], 1
    walked = len(walks)
    tree.evict(200)  # everything unlocked goes, its matched node too
    assert admission.form_extend_batch(sched) == [] and len(walks) == walked + 1
    assert other.waiting_match[1].length == 0


class WholePromptInBatch:
    """The in-batch check as it was before InBatchTails: one tree over every admitted request's whole
    reusable key (the reference the tails must agree with)."""

    def __init__(self, threshold: int) -> None:
        self.tree = RadixCache(allocator=None, page_size=1)
        self.threshold = threshold

    def fresh_enough(self, req: Req, match, _in_batch) -> bool:
        key = req.token_range(0, admission.match_limit(req))
        shared = self.tree.match_prefix(key).length - match.length
        if shared > self.threshold:
            return False
        rest = req.seq_len - match.length
        if req.sampling.max_new_tokens == 0 and shared >= admission.SCORING_SHARE_MIN and 2 * shared >= rest:
            return False
        self.tree.insert(key, torch.zeros(len(key), dtype=torch.int64))
        return True


def _admitted(cached: list, prompts: list, threshold: int, reference: bool = False) -> list:
    alloc = PageAllocator(4097, 1)
    tree = RadixCache(alloc, 1)
    for key in cached:
        tree.insert(key, alloc.alloc(len(key)))
    kv = KVManager(SimpleNamespace(allocator=alloc, page_size=1), ReqToTokenPool(16, 512, "cpu"), tree)
    waiting = [Req(f"r{i}", p, SamplingParams(max_new_tokens=new), arrival_seq=i)
               for i, (p, new) in enumerate(prompts)]  # fmt: skip
    args = SimpleNamespace(chunked_prefill_size=0, max_prefill_tokens=4096, schedule_policy="fcfs",
                           max_running_requests=16, page_size=1, resolve_in_batch_threshold=lambda device: threshold)  # fmt: skip
    sched = SimpleNamespace(args=args, waiting=waiting, running=[], chunked=None, tree=tree, kv=kv, device="cpu",
                            stats=SchedulerStats(), new_token_ratio=0.0, num_running=0, reserve=KVReserve())  # fmt: skip
    fresh_enough = admission.fresh_enough
    if reference:
        admission.fresh_enough = WholePromptInBatch(threshold).fresh_enough
    try:
        return [(req.rid, n) for req, n in admission.form_extend_batch(sched)]
    finally:
        admission.fresh_enough = fresh_enough


PIECES = [list(range(b, b + n)) for b, n in ((1000, 40), (2000, 20), (3000, 36), (4000, 8), (5000, 17))]


@settings(max_examples=150, deadline=None)
@given(cached=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=3), max_size=3),
       prompts=st.lists(st.tuples(st.lists(st.integers(0, 4), min_size=1, max_size=4), st.sampled_from([0, 4])),
                        min_size=1, max_size=8),
       threshold=st.sampled_from([4, 32]))  # fmt: skip
def test_in_batch_deferral_by_tails_is_the_whole_prompts_rule(cached, prompts, threshold):
    """Requests built from shared pieces (few-shot prefixes, questions, a select's choices: max_new_tokens 0),
    some of them cached: InBatchTails admits and defers exactly the requests the whole-prompt tree did, at
    the CPU's threshold and the GPU's."""
    cached = [sum((PIECES[i] for i in key), []) for key in cached]
    prompts = [(sum((PIECES[i] for i in key), []), new) for key, new in prompts]
    assert _admitted(cached, prompts, threshold) == _admitted(cached, prompts, threshold, reference=True)


def test_a_request_sharing_a_long_uncached_tail_after_a_cached_prefix_waits():
    few_shot, question = PIECES[0], PIECES[2]
    prompts = [(few_shot + question + [1], 4), (few_shot + question + [2], 4), (few_shot + PIECES[1], 4)]
    assert _admitted([few_shot], prompts, 32) == [("r0", 37), ("r2", 20)]


def test_the_cpus_threshold_defers_a_short_shared_tail_the_gpus_computes_twice():
    """A fork's branches after a short uncached context (tree_of_thought at small sizes): on the GPU a pass
    computes the few shared tokens twice at almost no cost; on the CPU the second branch waits a pass."""
    context, branches = PIECES[3], [[7, 1], [7, 2]]  # 8 shared uncached tokens, then 1 more, then their own
    prompts = [(context + b, 4) for b in branches]
    assert _admitted([], prompts, 32) == [("r0", 10), ("r1", 10)]
    assert _admitted([], prompts, 4) == [("r0", 10)]


class _Sched(SimpleNamespace):
    @property
    def num_running(self) -> int:  # as Scheduler.num_running: a chunked request counts
        return len(self.running) + (self.chunked is not None)


def test_a_chunked_request_finishing_its_prefill_counts_against_max_running_requests():
    """The pass that ends a chunked prefill no longer holds the request as `chunked`, and the request
    is not running yet: it is in the batch. Admission must count it, or one request more than
    max_running_requests runs (and, on the GPU, its batch has no CUDA graph: graphs go up to the cap)."""
    alloc = PageAllocator(200, 1)
    tree = RadixCache(alloc, 1)
    kv = KVManager(SimpleNamespace(allocator=alloc, page_size=1), ReqToTokenPool(8, 128, "cpu"), tree)
    long = Req("long", list(range(100, 120)), SamplingParams(max_new_tokens=1), arrival_seq=0)
    short = [Req(f"s{i}", list(range(200 + 10 * i, 204 + 10 * i)), SamplingParams(max_new_tokens=1), arrival_seq=1 + i)
             for i in range(2)]  # fmt: skip
    args = SimpleNamespace(chunked_prefill_size=16, max_prefill_tokens=4096, schedule_policy="fcfs",
                           max_running_requests=2, page_size=1, resolve_in_batch_threshold=lambda device: 32)  # fmt: skip
    sched = _Sched(args=args, waiting=[long, *short], running=[], chunked=None, tree=tree, kv=kv, device="cpu",
                   stats=SchedulerStats(), new_token_ratio=0.0, reserve=KVReserve())  # fmt: skip

    assert admission.form_extend_batch(sched) == [(long, 16)] and sched.chunked is long
    long.kv_len += 16  # the pass ran
    batch = admission.form_extend_batch(sched)

    assert batch == [(long, 4), (short[0], 4)] and sched.chunked is None
    assert sched.waiting == [short[1]]


def test_the_engine_never_runs_more_requests_than_max_running_requests_with_chunked_prefill(engine):
    """End to end on the default model: prompts cut into 16-token chunks, at most 2 running. Before the fix the
    step after a chunked prefill ended ran 3."""
    sched, seen = engine.scheduler, []
    saved = (sched.args.max_running_requests, sched.args.chunked_prefill_size, sched.step)

    def step():
        out = saved[2]()
        seen.append(len(sched.running))
        return out

    sched.args.max_running_requests, sched.args.chunked_prefill_size, sched.step = 2, 16, step
    try:
        prompts = [f"A long story about a lighthouse keeper named Mara, part {i}, told slowly. " * 2 for i in range(6)]
        outs = engine.generate(prompts, {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True})
    finally:
        sched.args.max_running_requests, sched.args.chunked_prefill_size = saved[:2]
        del sched.step  # the instance attribute: the class's step again
    assert len(outs) == 6 and all(o["meta_info"]["completion_tokens"] == 6 for o in outs)
    assert max(seen) == 2  # the cap held, and was reached
