"""Accounting over the scheduler: KV usage, the slot-ownership invariant (every usable
page is free, in the radix tree, or owned by one running request), and counters."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixflow.runtime.scheduling.scheduler import Scheduler


def token_usage(sched: Scheduler) -> float:
    cap = sched.runner.kv_pool.allocator.capacity_slots
    return (cap - sched.kv.available_slots()) / cap


def owned_pages(sched: Scheduler) -> torch.Tensor:
    """Free pages, tree pages and running requests' own pages (with repeats, if any)."""
    alloc = sched.runner.kv_pool.allocator
    ps = alloc.page_size
    owners = [alloc.free_pages, torch.unique(sched.tree.all_slots() // ps)]
    for req in sched.running + ([sched.chunked] if sched.chunked else []):
        own = sched.kv.req_to_token.read(req.req_pool_idx, req.kv_len, start=req.tree_len)
        owners.append(torch.unique(own // ps))
    return torch.cat(owners)


def check_invariants(sched: Scheduler) -> None:
    """Every usable slot is free, owned by one running request, or by one tree node."""
    alloc = sched.runner.kv_pool.allocator
    pages = owned_pages(sched)
    assert pages.numel() == torch.unique(pages).numel(), "a KV page has two owners"
    assert pages.numel() == alloc.num_pages - 1, f"KV pages leaked: {alloc.num_pages - 1 - pages.numel()}"


def reclaim_unowned_pages(sched: Scheduler) -> int:
    """After a step raised: free pages nobody owns (allocated for a pass that never
    completed, so no request's kv_len covers them). Returns how many."""
    alloc = sched.runner.kv_pool.allocator
    lost = torch.ones(alloc.num_pages, dtype=torch.bool)
    lost[0] = False
    lost[owned_pages(sched).cpu()] = False
    pages = lost.nonzero().flatten()
    alloc.free(pages)
    return int(pages.numel())


class SchedulerStats:
    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.extend_tokens = 0
        self.decode_tokens = 0
        self.retractions = 0
        self.forward_steps = 0  # scheduler steps that launched a forward pass (extend or decode)
        self.chained_decode_steps = 0  # decode passes launched before the previous one was read back
        self.fed_rows = 0  # overlapped decode rows that fed a pending (jump-forward) token, their sample dropped
        self.continued_rows = 0  # overlapped rows of a request graph's gen continued by the read-back before their sample
        self.mixed_steps = 0  # extend passes that also took the running requests' next tokens (--enable-mixed-chunk)
        self.split_decode_steps = 0  # decode steps run as an extend pass of the continuing rows and a decode pass
        self.late_extend_read_backs = 0  # extend passes read back after the next extend pass was launched
        self.grammar_rows_switched = 0  # auto: running rows moved from llguidance to outlines mid-request

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
