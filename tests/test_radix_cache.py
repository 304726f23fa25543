"""Property test: random insert / match / lock / unlock / evict sequences keep every
KV page owned exactly once and leak nothing."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixflow.radix_cache.memory_pool import PageAllocator
from radixflow.radix_cache.radix_tree import RadixCache

NUM_PAGES = 64

# small alphabet so that sequences share prefixes often
seqs = st.lists(st.integers(0, 3), min_size=1, max_size=24)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), seqs),
        st.tuples(st.just("match_lock"), seqs),
        st.tuples(st.just("unlock"), st.integers(0, 50)),
        st.tuples(st.just("evict"), st.integers(1, 40)),
    ),
    max_size=60,
)


class Model:
    """Drives a RadixCache the way the scheduler does, and checks ownership."""

    def __init__(self, page_size: int):
        self.ps = page_size
        self.alloc = PageAllocator(NUM_PAGES, page_size)
        self.tree = RadixCache(self.alloc, page_size)
        self.locks: list = []

    def insert(self, key: list) -> None:
        key = key[: len(key) - len(key) % self.ps]
        if not key:
            return
        match = self.tree.match_prefix(key)
        self.tree.inc_lock(match.node)
        n_new_pages = (len(key) - match.length) // self.ps
        pages = self.alloc.alloc(n_new_pages)
        if pages is None:
            self.tree.evict(n_new_pages * self.ps)
            pages = self.alloc.alloc(n_new_pages)
        if pages is None:
            self.tree.dec_lock(match.node)
            return
        slots = torch.cat([match.slots, self.alloc.slots_of(pages)])
        if len(key) % 2:  # from the root, or (as the scheduler does) on from the locked match
            cached, inserted = self.tree.insert_matched(key, slots)
            joined = inserted.slots
        else:
            cached, inserted = self.tree.insert_matched(key[match.length :], slots[match.length :], match.node)
            cached += match.length
            joined = torch.cat([match.slots, inserted.slots])
        after = self.tree.match_prefix(key)  # insert_matched's match is the one a new walk finds
        assert inserted.node is after.node and torch.equal(joined, after.slots)
        if cached > match.length:
            self.alloc.free_slots(slots[match.length : cached])
        self.tree.dec_lock(match.node)

    def check(self) -> None:
        tree_pages = self.tree.all_slots() // self.ps
        tree_pages = torch.unique(tree_pages) if tree_pages.numel() else tree_pages
        assert tree_pages.numel() * self.ps == self.tree.total_size
        owned = torch.cat([self.alloc.free_pages, tree_pages])
        assert owned.numel() == torch.unique(owned).numel(), "a page is both free and cached, or cached twice"
        assert owned.numel() == NUM_PAGES - 1, "a page leaked"
        assert 0 not in owned.tolist(), "the scratch page was handed out"
        assert self.tree.protected_size == sum(self._locked_sizes())
        for node in self.tree.nodes():
            if node is not self.tree.root:
                assert len(node.key) == node.value.numel() and len(node.key) % self.ps == 0

    def _locked_sizes(self):
        return [len(n.key) for n in self.tree.nodes() if n is not self.tree.root and n.lock_ref > 0]


def run_ops(page_size: int, operations: list) -> None:
    m = Model(page_size)
    for op, arg in operations:
        if op == "insert":
            m.insert(arg)
        elif op == "match_lock":
            match = m.tree.match_prefix(arg)
            assert match.length % page_size == 0 and match.length <= len(arg)
            m.tree.inc_lock(match.node)
            m.locks.append(match.node)
        elif op == "unlock" and m.locks:
            m.tree.dec_lock(m.locks.pop(arg % len(m.locks)))
        elif op == "evict":
            before = m.alloc.num_free_slots
            freed = m.tree.evict(arg)
            assert m.alloc.num_free_slots - before == freed
        m.check()
    locked_nodes = set(m.locks)
    for node in m.tree.nodes():
        if node.lock_ref > 0 and node is not m.tree.root:
            assert node in locked_nodes or any(_is_ancestor(node, l) for l in locked_nodes)
    while m.locks:
        m.tree.dec_lock(m.locks.pop())
    m.tree.evict(NUM_PAGES * page_size)
    assert m.alloc.num_free_pages == NUM_PAGES - 1, "eviction of an unlocked tree must free everything"
    assert m.tree.total_size == 0


def _is_ancestor(a, b) -> bool:
    while b is not None:
        if b is a:
            return True
        b = b.parent
    return False


@settings(max_examples=150, deadline=None)
@given(ops)
def test_radix_cache_ownership_page_1(operations):
    run_ops(1, operations)


@settings(max_examples=100, deadline=None)
@given(ops)
def test_radix_cache_ownership_page_2(operations):
    run_ops(2, operations)


def test_match_splits_and_shares():
    alloc = PageAllocator(32, 1)
    tree = RadixCache(alloc, 1)
    a = alloc.slots_of(alloc.alloc(5))
    tree.insert([1, 2, 3, 4, 5], a)
    m = tree.match_prefix([1, 2, 3, 9])
    assert m.length == 3 and m.slots.tolist() == a[:3].tolist()
    b = alloc.slots_of(alloc.alloc(2))
    assert tree.insert([1, 2, 3, 7, 8], torch.cat([a[:3], b])) == 3
    assert tree.match_prefix([1, 2, 3, 7, 8, 9]).slots.tolist() == a[:3].tolist() + b.tolist()
    tree.inc_lock(tree.match_prefix([1, 2, 3, 7, 8]).node)
    assert tree.evict(100) == 2  # only the unlocked [4, 5] leaf can go
    assert tree.match_prefix([1, 2, 3, 4, 5]).length == 3


def test_insert_joins_no_slot_tensors(monkeypatch):
    """insert() runs per finished request and per admission candidate per step: it must not
    pay insert_matched's join of the path's slots, which its callers would throw away."""
    alloc = PageAllocator(32, 1)
    tree = RadixCache(alloc, 1)
    a = alloc.slots_of(alloc.alloc(6))
    tree.insert([1, 2, 3], a[:3])

    def no_cat(*args, **kwargs):
        raise AssertionError("insert() joined slot tensors")

    monkeypatch.setattr(torch, "cat", no_cat)
    assert tree.insert([1, 2, 3, 4, 5, 6], a) == 3  # walks the cached node, then adds a leaf
    assert tree.insert([1, 2, 3, 4], a[:4]) == 4  # splits the leaf, ends inside the path


def test_freeing_pages_does_not_copy_the_free_list(monkeypatch):
    """A request that frees a few pages must not copy the whole free list (hundreds of
    thousands of pages on a GPU): pages queue behind it, and the list is rebuilt only when
    an allocation reaches them. Pages still come back in the order they were freed."""
    alloc = PageAllocator(100_001, 1)
    reference = list(range(1, 100_001))  # the free list as a plain queue
    copied = []
    real_cat = torch.cat
    monkeypatch.setattr(torch, "cat", lambda ts, *a, **k: copied.append(sum(t.numel() for t in ts)) or real_cat(ts, *a, **k))
    held = []
    for i in range(200):
        pages = alloc.alloc(3)
        assert pages.tolist() == reference[:3]
        reference = reference[3:]
        held.append(pages)
        if i % 2:
            freed = held.pop(0)
            alloc.free(freed)
            reference += freed.tolist()
    assert alloc.num_free_pages == len(reference)
    assert sum(copied) < 100_000  # appending at each free would copy the whole list each time
    assert alloc.alloc(alloc.num_free_pages).tolist() == reference


def test_free_slots_frees_each_page_once_at_page_size_1_and_4():
    """free_slots gives back the pages its slots start or cover: at page size 1 each slot as
    it is (no unique pass), at page size 4 each page once, a partly used tail page whole."""
    for page_size, slots, pages in ((1, [7, 3, 5], [7, 3, 5]), (4, [8, 9, 10, 11, 20, 21], [2, 5])):
        alloc = PageAllocator(16, page_size)
        taken = alloc.alloc(alloc.num_free_pages)
        alloc.free_slots(torch.tensor(slots, dtype=torch.int64))
        assert alloc.num_free_pages == len(pages)
        assert alloc.alloc(len(pages)).tolist() == pages and alloc.alloc(1) is None
        assert set(pages) <= set(taken.tolist())



def _leaf_tree(n: int) -> tuple[RadixCache, PageAllocator, list]:
    """n unlocked 2-token leaves under one shared 2-token node, inserted in order (the first is the LRU)."""
    alloc = PageAllocator(4 * n + 8, 1)
    tree = RadixCache(alloc, 1)
    keys = [[0, 1, i + 2, i + 2] for i in range(n)]
    for k in keys:
        slots = alloc.slots_of(alloc.alloc(4))
        alloc.free_slots(slots[: tree.insert(k, slots)])  # the shared node's duplicates
    return tree, alloc, keys


def test_evicting_a_few_tokens_does_not_walk_the_tree_each_time(monkeypatch):
    """With a full pool every allocation evicts a few tokens: walking every node each time grew with the
    tree (14 ms at 10^4 nodes). Later evictions reuse the first walk's heap of leaves."""
    tree, _, _ = _leaf_tree(200)
    walks = []
    leaves = tree._leaves
    monkeypatch.setattr(tree, "_leaves", lambda: walks.append(1) or leaves())
    for _ in range(50):
        assert tree.evict(1) == 2
    assert len(walks) == 1


def test_eviction_from_the_kept_list_is_lru_and_skips_locked_and_touched_leaves():
    tree, alloc, keys = _leaf_tree(6)
    assert tree.evict(1) == 2  # walks; the oldest leaf goes
    assert tree.match_prefix(keys[0]).length == 2
    tree.match_prefix(keys[1])  # touched since the walk: no longer the oldest
    locked = tree.match_prefix(keys[2]).node
    tree.inc_lock(locked)  # locked since the walk: not evicted
    assert tree.evict(2) == 2
    assert tree.match_prefix(keys[3]).length == 2, "the least recently used unlocked leaf goes next"
    assert [tree.match_prefix(k).length for k in (keys[1], keys[2], keys[4], keys[5])] == [4, 4, 4, 4]
    assert tree.evict(2) == 2 and tree.match_prefix(keys[1]).length == 2  # touched before keys[4], keys[5]
    tree.dec_lock(locked)  # unlocked after the walk: the next walk finds it
    free = alloc.num_free_slots
    assert tree.evict(100) == 8 and tree.total_size == 0 and alloc.num_free_slots - free == 8


def test_a_leaf_used_since_the_walk_outlives_an_older_one_created_since():
    """A leaf touched after the walk must not go before one created after the walk and never used since:
    skipping touched leaves until the next walk keeps true LRU order."""
    alloc = PageAllocator(64, 1)
    tree = RadixCache(alloc, 1)

    def insert(key):
        slots = alloc.slots_of(alloc.alloc(len(key)))
        alloc.free_slots(slots[: tree.insert(key, slots)])

    insert([1, 1])
    insert([2, 2])
    assert tree.evict(2) == 2 and tree.match_prefix([1, 1]).length == 0  # walks; the older leaf goes
    insert([3, 3])  # created after the walk, never used again
    tree.match_prefix([2, 2])  # used after it: now the most recently used
    assert tree.evict(2) == 2
    assert tree.match_prefix([3, 3]).length == 0 and tree.match_prefix([2, 2]).length == 2


def test_an_insert_from_a_locked_node_touches_its_path_as_one_from_the_root():
    """LRU order does not depend on where the walk starts: the locked node's ancestors are touched
    root first, then the new leaf, as a walk from the root does."""
    alloc = PageAllocator(NUM_PAGES, 1)
    trees = [RadixCache(alloc, 1), RadixCache(PageAllocator(NUM_PAGES, 1), 1)]
    for i, tree in enumerate(trees):
        tree.insert([1, 2, 3], torch.tensor([5, 6, 7]))
        tree.insert([1, 2, 9], torch.tensor([5, 6, 8]))  # splits: [1, 2] -> {[3], [9]}
        m = tree.match_prefix([1, 2, 3])
        tree.inc_lock(m.node)
        tree.match_prefix([1, 2, 9])  # [9] and [1, 2] touched after [3]
        if i == 0:
            tree.insert_matched([1, 2, 3, 4, 4], torch.tensor([5, 6, 7, 10, 11]))
        else:
            tree.insert_matched([4, 4], torch.tensor([10, 11]), m.node)
    orders = [[(n.key, n.value.tolist()) for n in sorted(t.nodes(), key=lambda n: n.last_access)] for t in trees]
    assert orders[0] == orders[1]
    assert [key for key, _ in orders[0][-5:]] == [[9], [], [1, 2], [3], [4, 4]]


def test_a_match_stays_current_until_its_next_tokens_are_added_under_it_or_it_is_evicted():
    alloc = PageAllocator(32, 1)
    tree = RadixCache(alloc, 1)
    a = alloc.slots_of(alloc.alloc(5))
    tree.insert([1, 2, 3, 4, 5], a)
    m = tree.match_prefix([1, 2, 3, 4, 9])
    assert m.length == 4 and tree.still_current(m)
    tree.match_prefix([1, 2])  # splits the path above m's node
    tree.insert([6, 6], alloc.slots_of(alloc.alloc(2)))  # elsewhere
    tree.insert([1, 2, 3, 4, 8], torch.cat([a[:4], alloc.slots_of(alloc.alloc(1))]))  # under it, other tokens
    assert tree.still_current(m) and m.slots.tolist() == a[:4].tolist()
    assert not tree.still_current(tree.insert_matched([6, 6], alloc.slots_of(alloc.alloc(2)))[1])  # not a walk's
    tree.insert([1, 2, 3, 4, 9, 9], torch.cat([a[:4], alloc.slots_of(alloc.alloc(2))]))
    assert not tree.still_current(m) and tree.match_prefix([1, 2, 3, 4, 9]).length == 5
    m = tree.match_prefix([6, 6])
    tree.evict(32)
    assert not tree.still_current(m)


@settings(max_examples=150, deadline=None)
@given(ops, st.lists(seqs, min_size=1, max_size=4))
def test_a_match_that_stays_current_is_what_a_new_walk_gives(operations, keys):
    """After any insert / match / lock / evict sequence, a kept match the tree calls current equals a
    fresh match_prefix of its key: length, node and slots (pages of 1 and 2)."""
    for page_size in (1, 2):
        m = Model(page_size)
        kept = [(key, m.tree.match_prefix(key)) for key in keys]
        for op, arg in operations:
            if op == "insert":
                m.insert(arg)
            elif op == "match_lock":
                m.tree.match_prefix(arg)
            elif op == "evict":
                m.tree.evict(arg)
            for i, (key, match) in enumerate(kept):
                current = m.tree.still_current(match)
                fresh = m.tree.match_prefix(key)
                if current:
                    assert fresh.node is match.node and torch.equal(fresh.slots, match.slots)
                kept[i] = (key, fresh)


def _flush_case(device: str, writes: list, flush_after) -> None:
    from radixflow.radix_cache.memory_pool import ReqToTokenPool

    pool = ReqToTokenPool(4, 20, device)
    if pool.host is pool.table:  # on the CPU: a host copy apart, as on a GPU
        pool.host = pool.table.clone()
    want = torch.zeros(4, 20, dtype=torch.int32)
    for i, (row, start, slots) in enumerate(writes):
        pool.write(row, start, torch.tensor(slots, dtype=torch.int64))
        want[row, start : start + len(slots)] = torch.tensor(slots, dtype=torch.int32)
        if flush_after is not None and i % flush_after == flush_after - 1:
            pool.flush()
    assert torch.equal(pool.host, want)
    for row in range(4):  # the host reads see every write (int64 copies)
        got = pool.read(row, 20, start=3)
        assert got.dtype == torch.int64 and torch.equal(got, want[row, 3:].to(torch.int64))
        assert pool.read_at(row, 5) == int(want[row, 5])
    pool.flush()
    assert torch.equal(pool.table.cpu(), want)
    pool.flush()  # nothing noted since: a no-op
    assert torch.equal(pool.table.cpu(), want)


WRITES = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 12), st.lists(st.integers(1, 99), max_size=6)), max_size=12)


@settings(max_examples=100, deadline=None)
@given(WRITES, st.sampled_from([None, 3, 7]))
def test_req_to_token_writes_reach_the_device_table_at_flush(writes, flush_after):
    """A table whose host copy is apart (as on a GPU; here both on the CPU): writes land on the host at
    once and on the device table only at flush, all of them, in their order (a later write of a cell wins)."""
    _flush_case("cpu", writes, flush_after)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@settings(max_examples=30, deadline=None)
@given(WRITES, st.sampled_from([None, 3]))
def test_gpu_req_to_token_flush(writes, flush_after):
    _flush_case("cuda", writes, flush_after)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=8))
def test_span_reads_and_concatenated_ranges_match_a_loop(spans):
    """The extend pass's inputs built without a loop over requests: read_spans against a read per span, and
    concat_ranges against an arange per request."""
    from radixflow.radix_cache.memory_pool import ReqToTokenPool
    from radixflow.runtime.scheduling.forward_inputs import concat_ranges

    pool = ReqToTokenPool(4, 40, "cpu")
    pool.host.copy_(torch.arange(160, dtype=torch.int32).view(4, 40))
    spans = [(row, a, a + n) for row, a, n in spans]
    got = pool.read_spans(spans)
    assert got.dtype == torch.int64 and torch.equal(got, torch.cat([pool.read(r, b, start=a) for r, a, b in spans]))
    starts, lens = [a for _, a, _ in spans], [b - a for _, a, b in spans]
    assert torch.equal(concat_ranges(starts, lens), torch.cat([torch.arange(a, a + n) for a, n in zip(starts, lens)]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(1, 5)), min_size=1, max_size=7), st.booleans())
def test_forward_batch_index_tensors_are_aligned_and_hold_their_values(reqs, device_ids):
    """build_forward_batch's index tensors each start 16-byte aligned in the pass's one copy (Triton compiles a
    kernel variant per pointer alignment) and hold the values of each request's rows, for any parity of the
    pass's token and request counts."""
    from types import SimpleNamespace

    from radixflow.runtime.execution.forward_batch import ForwardMode
    from radixflow.runtime.scheduling.forward_inputs import build_forward_batch, concat_ranges

    prefix, ext = [p for p, _ in reqs], [n for _, n in reqs]
    batch = [(SimpleNamespace(req_pool_idx=10 + i), n) for i, n in enumerate(ext)]
    tokens = sum(ext)
    ids = torch.arange(100, 100 + tokens) if device_ids else list(range(100, 100 + tokens))
    positions, locs = concat_ranges(prefix, ext), torch.arange(500, 500 + tokens)
    rows = [[sum(ext[: i + 1]) - 1] for i in range(len(ext))]
    fb = build_forward_batch(torch.device("cpu"), ForwardMode.EXTEND, ids, positions, locs, batch, prefix, ext, rows)
    want = {"input_ids": list(range(100, 100 + tokens)), "positions": positions.tolist(), "out_cache_loc": locs.tolist(),
            "req_pool_indices": [10 + i for i in range(len(ext))], "seq_lens": [p + n for p, n in reqs],
            "prefix_lens": prefix, "extend_lens": ext, "logits_indices": [r[0] for r in rows]}
    for name, values in want.items():
        t = getattr(fb, name)
        assert t.tolist() == values, name
        assert name == "input_ids" and device_ids or t.data_ptr() % 16 == 0, name


def test_req_table_cost_benchmark_runs(capsys):
    """benchmarks/programs/req_table_cost.py, tiny: its table has a row per size with a ratio."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "programs", "req_table_cost.py")
    spec = importlib.util.spec_from_file_location("req_table_cost", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(["--requests", "2,3", "--prefix", "6", "--new", "2", "--repeats", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2 ") or line.startswith("| 3 ")]
    assert len(rows) == 2 and all(row.count("x |") == 1 for row in rows)
