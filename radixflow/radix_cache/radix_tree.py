"""RadixCache: a radix tree over token ids whose nodes own KV slots.

Each node holds a run of tokens (`key`) and the KV slots that hold them (`value`),
a lock count of running requests that use it, and a last-access time for LRU
eviction. With page_size > 1 keys are whole pages and matches round down to pages.

Invariant: every usable slot is free, owned by one running request's private tail,
or owned by exactly one tree node. Locked nodes (and their ancestors) are never evicted.
"""

from __future__ import annotations

import heapq
import itertools
import operator
from dataclasses import dataclass, field
from typing import Iterator, Optional

import torch

from radixflow.radix_cache.memory_pool import PageAllocator

_clock = itertools.count()
_ties = itertools.count()  # heap tie-breaks, kept off the LRU clock
_UNWALKED = object()  # a MatchResult that is not match_prefix's: RadixCache.still_current cannot tell


@dataclass(eq=False)
class TreeNode:
    key: list = field(default_factory=list)
    value: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    parent: Optional["TreeNode"] = None
    children: dict = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0

    def touch(self) -> None:
        self.last_access = next(_clock)

    def __lt__(self, other: "TreeNode") -> bool:
        return self.last_access < other.last_access


class MatchResult:
    """A matched prefix: its length, its deepest node (lock this while using the prefix) and
    its KV slots in position order, joined from the path's nodes on first use (admission
    matches every waiting request to order them, and uses the slots of the few it admits)."""

    def __init__(self, parts: list, node: TreeNode, next_key: object = _UNWALKED) -> None:
        self.parts, self.node = parts, node
        self.length = sum(int(p.numel()) for p in parts)
        self._slots: Optional[torch.Tensor] = None
        self.next_key = next_key  # match_prefix's: the child key it found missing, None at the key's end

    @property
    def slots(self) -> torch.Tensor:
        if self._slots is None:
            self._slots = torch.cat(self.parts) if self.parts else torch.empty(0, dtype=torch.int64)
        return self._slots


def _common_prefix_len(node_key: list, key: list, start: int) -> int:
    """How many tokens of `node_key` equal key[start:], compared in C (slicing only as much of
    `key` as the node holds, so a walk copies the key once). Where they differ, a binary search
    over slice comparisons finds the first difference: O(n) in C in all, where converting the
    lists to arrays cost a Python-level conversion of every token."""
    n = min(len(node_key), len(key) - start)
    head = key[start : start + n]
    if (node_key if n == len(node_key) else node_key[:n]) == head:  # the common case
        return n
    lo, hi = 0, n - 1  # node_key[:lo] == head[:lo], and they differ before index hi + 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if node_key[lo:mid] == head[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class RadixCache:
    def __init__(self, allocator: PageAllocator, page_size: int = 1, disable: bool = False):
        self.allocator = allocator
        self.page_size = page_size
        self.disable = disable
        self.reset()

    def reset(self) -> None:
        if getattr(self, "root", None) is not None:
            self.discard()
        self.root = TreeNode()
        self.root.lock_ref = 1
        self.evictable_size = 0
        self.protected_size = 0
        self._lru: list = []  # the unlocked leaves at evict()'s last walk, least recently used first
        self._lru_at = 0  # the next of them to consider
        self._lru_walk = 0  # the clock at that walk: a leaf touched since is out of the list's order
        self._lru_late: list = []  # heap of (last_access, tie, leaf): parents left leafless by eviction

    # -- helpers -----------------------------------------------------------------------
    def _child_key(self, key: list, start: int = 0):
        return key[start] if self.page_size == 1 else tuple(key[start : start + self.page_size])

    def _page_align(self, n: int) -> int:
        return n - n % self.page_size

    def _split(self, node: TreeNode, at: int) -> TreeNode:
        """Split `node` so that its first `at` tokens become a new parent node."""
        head = TreeNode(key=node.key[:at], value=node.value[:at], parent=node.parent, lock_ref=node.lock_ref)
        head.last_access = node.last_access
        head.children = {self._child_key(node.key[at:]): node}
        head.parent.children[self._child_key(head.key)] = head
        node.key, node.value, node.parent = node.key[at:], node.value[at:], head
        return head

    # -- public API ------------------------------------------------------------------
    def match_prefix(self, key: list) -> MatchResult:
        """Longest cached prefix of `key` (page aligned). Touches the matched path."""
        if self.disable:
            return MatchResult([], self.root)
        end = self._page_align(len(key))
        key = key if end == len(key) else key[:end]
        node, done, parts = self.root, 0, []
        node.touch()
        while done < end:
            child = node.children.get(self._child_key(key, done))
            if child is None:
                break
            n = self._page_align(_common_prefix_len(child.key, key, done))
            if n == 0:
                break
            if n < len(child.key):
                child = self._split(child, n)
            child.touch()
            parts.append(child.value)
            node, done = child, done + n
        return MatchResult(parts, node, self._child_key(key, done) if done < end else None)

    def insert(self, key: list, slots: torch.Tensor) -> int:
        """Insert `key` with its KV `slots`; returns how many leading tokens were
        already cached. The caller owns (and must free) its duplicates of those slots.
        Only the page-aligned part of `key` is inserted; the caller keeps the rest."""
        return self._insert_walk(key, slots)[0]

    def insert_matched(self, key: list, slots: torch.Tensor, after: Optional[TreeNode] = None) -> tuple[int, MatchResult]:
        """insert(), and what match_prefix(key) would return right after it (the tree's slots
        for the page-aligned key and its deepest node), from the same walk. With `after`, a node
        the caller holds locked (so it stays attached and its path unchanged), `key` and `slots`
        continue that node's path and the walk starts there: the count and the match then cover
        `key` only. A request's locked prefix is thousands of tokens of a few-shot prompt, which
        a walk from the root would slice and compare again on every insert."""
        cached, node, parts = self._insert_walk(key, slots, after)
        return cached, MatchResult(parts, node)

    def _insert_walk(self, key: list, slots: torch.Tensor, after: Optional[TreeNode] = None) -> tuple[int, TreeNode, list]:
        """insert()'s walk: returns how many leading tokens were already cached, the deepest
        node of the page-aligned key's path, and the slot tensors along that path (joined
        only by insert_matched, since insert's callers don't need them)."""
        if self.disable:
            return 0, self.root, []
        n_aligned = self._page_align(len(key))
        if n_aligned < len(key):
            key, slots = key[:n_aligned], slots[:n_aligned]
        node, done, parts = after or self.root, 0, []
        self._touch_path(node)
        while done < len(key):
            child = node.children.get(self._child_key(key, done))
            if child is None:
                leaf = TreeNode(key=key[done:], value=slots[done:].clone(), parent=node)
                leaf.touch()
                node.children[self._child_key(key, done)] = leaf
                self.evictable_size += len(leaf.key)
                parts.append(leaf.value)
                return done, leaf, parts
            n = self._page_align(_common_prefix_len(child.key, key, done))
            if n < len(child.key):
                child = self._split(child, n)
            child.touch()
            parts.append(child.value)
            node, done = child, done + n
        return min(done, len(key)), node, parts

    def _touch_path(self, node: TreeNode) -> None:
        """Touch `node` and its ancestors, the root first, as a walk from the root down to it does
        (the same LRU order whichever node a walk starts from)."""
        path = []
        while node is not None:
            path.append(node)
            node = node.parent
        for n in reversed(path):
            n.touch()

    def still_current(self, match: MatchResult) -> bool:
        """Whether match_prefix would give `match` (its node, so its length and slots) again for the key
        it was taken for; if so, touches its path as that walk would. While its node is attached, the walk
        reaches it (splits keep a node's end; eviction takes leaves, so never an ancestor of an attached
        node) and stops there unless a child for the key's next tokens was added since. Admission orders
        the waiting queue by match on every step; this spares walks over prompts that did not change."""
        node, nxt = match.node, match.next_key
        if nxt is _UNWALKED or not self.is_attached(node) or (nxt is not None and nxt in node.children):
            return False
        self._touch_path(node)
        return True

    def is_attached(self, node: TreeNode) -> bool:
        """Whether `node` is still in the tree: eviction detaches leaves, so a match taken
        before an allocation may name a node whose slots were freed since."""
        parent = node.parent
        return node is self.root or (parent is not None and parent.children.get(self._child_key(node.key)) is node)

    def inc_lock(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock(self, node: TreeNode) -> None:
        while node is not self.root:
            assert node.lock_ref > 0, "unlock of an unlocked node"
            if node.lock_ref == 1:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
            node.lock_ref -= 1
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` slots from unlocked LRU leaves (if possible).
        Returns the number of slots freed."""
        freed = 0
        while freed < num_tokens:
            leaf = self._pop_lru_leaf()
            if leaf is None:
                break
            self.allocator.free_slots(leaf.value)
            freed += len(leaf.key)
            self.evictable_size -= len(leaf.key)
            parent = leaf.parent
            del parent.children[self._child_key(leaf.key)]
            if parent is not self.root and self._walked_leaf(parent):
                heapq.heappush(self._lru_late, (parent.last_access, next(_ties), parent))
        return freed

    def _pop_lru_leaf(self) -> Optional[TreeNode]:
        """The least recently used unlocked leaf. With a full pool every allocation evicts a few tokens,
        and walking every node each time cost 14 ms at 10^4 nodes, so the leaves of the last walk are
        kept, sorted by last access (no tuple each: building 10^5 of them set off collections that
        tripled the walk), and taken while their place in that order still holds. A leaf touched,
        created or unlocked since the walk is used more recently than every leaf the walk saw untouched
        (or, if unlocked untouched, waits): it is skipped, and the next walk, when the list and the heap
        of parents left leafless run dry, finds it at its true time."""
        for walked in (False, True):
            node = self._next_lru_leaf()
            if node is not None or walked or self.evictable_size == 0:
                return node
            self._lru = sorted((n for n in self._leaves() if n.lock_ref == 0), key=operator.attrgetter("last_access"))
            self._lru_at, self._lru_walk, self._lru_late = 0, next(_clock), []
        return None

    def _next_lru_leaf(self) -> Optional[TreeNode]:
        lru, late = self._lru, self._lru_late
        while self._lru_at < len(lru) and not self._walked_leaf(lru[self._lru_at]):
            self._lru_at += 1
        while late and not self._walked_leaf(late[0][2]):
            heapq.heappop(late)
        head = lru[self._lru_at] if self._lru_at < len(lru) else None
        if late and (head is None or late[0][0] < head.last_access):
            return heapq.heappop(late)[2]
        self._lru_at += head is not None
        if self._lru_at == len(lru) and not late:
            self._lru = []  # drop the walk's references to detached nodes (and their slot tensors)
            self._lru_at = 0
        return head

    def _walked_leaf(self, node: TreeNode) -> bool:
        """An evictable leaf untouched since the last walk: its place in the walk's LRU order holds."""
        return node.last_access <= self._lru_walk and self._evictable_leaf(node)

    def _evictable_leaf(self, node: TreeNode) -> bool:
        return not node.lock_ref and not node.children and self.is_attached(node)

    def nodes(self) -> Iterator[TreeNode]:
        """Every node, the root first, depth first. A node's children are read before it is
        yielded, so the caller may detach them."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            yield node

    def discard(self) -> None:
        """Break the tree's parent <-> child cycles so that refcounting frees its nodes at once;
        left to the cyclic garbage collector, a dropped tree is freed in one full collection,
        during whatever pass is running. For a tree about to be dropped or reset."""
        for node in self.nodes():
            node.children, node.parent = {}, None

    def _leaves(self) -> list:
        return [n for n in self.nodes() if not n.children and n is not self.root]

    def all_slots(self) -> torch.Tensor:
        """Every slot owned by the tree (for invariant checks)."""
        return torch.cat([n.value for n in self.nodes()])

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size
