"""(Session 10, issue 29.) Time the radix tree's per-step operations (match, insert, lock, evict of a few tokens) with
trees of ~10^2 .. 10^5 nodes: which of them grow with the tree's size."""
import random, sys, time, statistics as st
import torch
from radixflow.radix_cache.memory_pool import PageAllocator
from radixflow.radix_cache.radix_tree import RadixCache

def build(n_leaves, seg=16, seed=0):
    rng = random.Random(seed)
    alloc = PageAllocator(n_leaves * (seg + 64) + 64, 1)
    tree = RadixCache(alloc, 1)
    base = [rng.randrange(1, 30000) for _ in range(64)]  # a shared prefix, then branches
    keys = []
    for i in range(n_leaves):
        k = base[: rng.randrange(8, 64)] + [rng.randrange(1, 30000) for _ in range(seg)]
        slots = alloc.alloc(len(k))
        tree.insert(k, slots)
        keys.append(k)
    return tree, alloc, keys

def timeit(fn, reps):
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return st.median(ts) * 1e3

for n in (100, 1000, 10000, 100000):
    tree, alloc, keys = build(n)
    nodes = sum(1 for _ in tree.nodes())
    k = keys[len(keys) // 2]
    m_ms = timeit(lambda: tree.match_prefix(k + [1, 2, 3]), 50)
    def lock():
        m = tree.match_prefix(k); tree.inc_lock(m.node); tree.dec_lock(m.node)
    l_ms = timeit(lock, 50)
    def ev():
        tree.evict(4)
    e_ms = timeit(ev, 10)
    print(f"leaves {n:>6} nodes {nodes:>6}: match {m_ms:.3f} ms, match+lock+unlock {l_ms:.3f} ms, evict(4 tokens) {e_ms:.2f} ms", flush=True)
