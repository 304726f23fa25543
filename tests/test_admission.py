"""Admission against a small KV pool, on the CPU without a model: the scheduler's state is a
stand-in holding the real KV manager, radix tree and pools."""

from __future__ import annotations

from types import SimpleNamespace

from radixflow.radix_cache.memory_pool import PageAllocator, ReqToTokenPool
from radixflow.radix_cache.radix_tree import RadixCache
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.scheduling import admission
from radixflow.runtime.scheduling.kv_audit import SchedulerStats
from radixflow.runtime.scheduling.kv_manager import KVManager
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
                           max_running_requests=8, page_size=1)  # fmt: skip
    sched = SimpleNamespace(args=args, waiting=[second, first], running=[], chunked=None, tree=tree, kv=kv,
                            stats=SchedulerStats(), new_token_ratio=0.0, num_running=0)  # fmt: skip

    batch = admission.form_extend_batch(sched)

    assert batch == [(first, free + 3)]
    assert tree.match_prefix(second_prefix).length == 0  # evicted, as the test intends
    assert sched.waiting == [second] and second.req_pool_idx is None and second.last_node is None
    assert tree.protected_size == len(first_prefix)
