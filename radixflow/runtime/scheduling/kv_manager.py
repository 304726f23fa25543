"""Moves KV slots between the free pool, running requests and the radix tree.

Ownership: a request owns the slots of its row in req_to_token from `tree_len` to
`kv_len`; the leading `tree_len` slots belong to the tree node it has locked.
"""

from __future__ import annotations

from typing import Optional

import torch

from radixflow.radix_cache.memory_pool import KVPool, ReqToTokenPool
from radixflow.radix_cache.radix_tree import MatchResult, RadixCache
from radixflow.runtime.scheduling.req import Req


class KVManager:
    def __init__(self, pool: KVPool, req_to_token: ReqToTokenPool, tree: RadixCache):
        self.pool = pool
        self.allocator = pool.allocator
        self.req_to_token = req_to_token
        self.tree = tree
        self.page_size = pool.page_size

    # -- capacity ------------------------------------------------------------------------
    def available_slots(self) -> int:
        """Free slots plus slots the tree could give back by eviction."""
        return self.allocator.num_free_slots + self.tree.evictable_size

    def used_slots(self) -> int:
        return self.allocator.capacity_slots - self.allocator.num_free_slots

    def pages_needed(self, req: Req, n: int) -> int:
        room = (-req.kv_len) % self.page_size
        return -(-max(n - room, 0) // self.page_size)

    # -- admission -----------------------------------------------------------------------
    def match(self, req: Req, limit: int) -> MatchResult:
        return self.tree.match_prefix(req.token_range(0, limit))

    def match_waiting(self, req: Req, limit: int) -> MatchResult:
        """match() for a waiting request (its tokens do not change while it waits), reusing its last
        match while the tree still gives it (RadixCache.still_current)."""
        last = req.waiting_match
        if last is not None and last[0] == (limit, req.seq_len) and self.tree.still_current(last[1]):
            return last[1]
        match = self.match(req, limit)
        req.waiting_match = ((limit, req.seq_len), match)
        return match

    def admit(self, req: Req, match: MatchResult) -> bool:
        """Give `req` a req_to_token row holding its cached prefix; lock the prefix."""
        assert self.tree.is_attached(match.node), "admitting a match whose node was evicted"
        row = self.req_to_token.alloc()
        if row is None:
            return False
        req.waiting_match = None  # its tokens may change once it runs
        req.req_pool_idx = row
        self.req_to_token.write(row, 0, match.slots)
        req.kv_len = req.tree_len = req.admitted_prefix = match.length
        req.last_node = match.node
        self.tree.inc_lock(match.node)
        return True

    def alloc(self, req: Req, n: int) -> Optional[torch.Tensor]:
        """Slots for the next `n` tokens of `req` (written into its row), or None."""
        if self.page_size == 1:  # a page is a slot: no partly used page, and the pages are the slots
            slots = self._alloc_pages(n) if n else torch.empty(0, dtype=torch.int64)
            if slots is not None:
                self.req_to_token.write(req.req_pool_idx, req.kv_len, slots)
            return slots
        room = (-req.kv_len) % self.page_size
        take = min(room, n)
        parts = []
        if take:
            last = self.req_to_token.read_at(req.req_pool_idx, req.kv_len - 1)
            parts.append(torch.arange(last + 1, last + 1 + take, dtype=torch.int64))
        n_pages = self.pages_needed(req, n)
        if n_pages:
            pages = self._alloc_pages(n_pages)
            if pages is None:
                return None
            parts.append(self.allocator.slots_of(pages)[: n - take])
        slots = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
        self.req_to_token.write(req.req_pool_idx, req.kv_len, slots)
        return slots

    def alloc_decode(self, reqs: list) -> Optional[torch.Tensor]:
        """One slot for each request's next token, in one allocation and one scatter
        into req_to_token (the per-step hot path)."""
        rows = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64)
        kv_lens = torch.tensor([r.kv_len for r in reqs], dtype=torch.int64)
        if self.page_size == 1:
            slots = self._alloc_pages(len(reqs))
            if slots is None:
                return None
        else:
            need_page = kv_lens % self.page_size == 0
            slots = self.req_to_token.host[rows, (kv_lens - 1).clamp(min=0)].to(torch.int64) + 1
            n_new = int(need_page.sum())
            if n_new:
                pages = self._alloc_pages(n_new)
                if pages is None:
                    return None
                slots[need_page] = pages * self.page_size
        self.req_to_token.write_points(rows, kv_lens, slots)
        return slots

    def _alloc_pages(self, n_pages: int) -> Optional[torch.Tensor]:
        pages = self.allocator.alloc(n_pages)
        if pages is None:
            short = n_pages - self.allocator.num_free_pages
            self.tree.evict(short * self.page_size)
            pages = self.allocator.alloc(n_pages)
        return pages

    # -- giving slots back -----------------------------------------------------------------
    def _own_slots(self, req: Req) -> torch.Tensor:
        """The request's own slots, past its locked prefix: only those are copied off the row."""
        return self.req_to_token.read(req.req_pool_idx, req.kv_len, start=req.tree_len)

    def _insert(self, req: Req, slots: Optional[torch.Tensor] = None) -> tuple[int, MatchResult]:
        """Hand the request's computed KV past its locked prefix (`tree_len` tokens, ending at
        `last_node`; `slots`: its own slots, read here when not given) to the tree; free its
        duplicates. Returns the page-aligned length now owned by the tree, and the tree's match
        for the part past the prefix."""
        start = req.tree_len
        slots = self._own_slots(req) if slots is None else slots
        cached, match = self.tree.insert_matched(req.token_range(start, req.kv_len), slots, req.last_node)
        if cached:  # another request inserted these tokens first
            self.allocator.free_slots(slots[:cached])
        return (req.kv_len - req.kv_len % self.page_size if not self.tree.disable else 0), match

    def cache_unfinished(self, req: Req) -> None:
        """After a prefill chunk: share what is computed so far and lock it. The row's slots of
        the locked prefix are the tree's already; only those past it may change."""
        if self.tree.disable:
            return
        aligned, match = self._insert(req)
        assert req.tree_len + match.length == aligned, (req.tree_len, match.length, aligned)
        self.req_to_token.write(req.req_pool_idx, req.tree_len, match.slots)
        self.tree.inc_lock(match.node)
        self.tree.dec_lock(req.last_node)
        req.last_node, req.tree_len = match.node, aligned

    def truncate(self, req: Req, new_len: int) -> None:
        """Forget KV past `new_len`; frees the request's own whole pages past it."""
        assert new_len <= req.kv_len
        if new_len < req.tree_len:  # give back part of the locked prefix: lock a shorter path
            match = self.tree.match_prefix(req.token_range(0, new_len))
            self.tree.inc_lock(match.node)
            self.tree.dec_lock(req.last_node)
            self.allocator.free_slots(self._own_slots(req))
            self.req_to_token.write(req.req_pool_idx, 0, match.slots)
            req.last_node, req.tree_len, req.kv_len = match.node, match.length, match.length
            return
        first_free = -(-new_len // self.page_size) * self.page_size  # keep a partly used page
        slots = self.req_to_token.read(req.req_pool_idx, req.kv_len, start=first_free)
        if slots.numel():
            self.allocator.free_slots(slots)
        req.kv_len = new_len

    def release(self, req: Req, cache: bool = True) -> None:
        """Free a request's row. With `cache`, its KV goes into the tree (if enabled)."""
        if req.req_pool_idx is None:
            return
        tail = self._own_slots(req)
        if cache and not self.tree.disable:
            aligned, _ = self._insert(req, tail)
            tail = tail[aligned - req.tree_len :]  # the tree's page alignment is at or past tree_len
        if tail.numel():
            self.allocator.free_slots(tail)
        if req.last_node is not None:
            self.tree.dec_lock(req.last_node)
        self.req_to_token.free(req.req_pool_idx)
        req.req_pool_idx, req.last_node = None, None
        req.kv_len = req.tree_len = 0
