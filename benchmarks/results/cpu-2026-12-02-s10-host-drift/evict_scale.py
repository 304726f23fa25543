"""A full KV pool under a radix tree of ~10^2-10^5 nodes: each step evicts 16 tokens and inserts a new
16-token leaf in their slots (what a long-running server does once the tree fills the pool). Per-step
milliseconds with RadixCache.evict as it is, and with the walk-every-call eviction it replaced
(`walk_evict`: the kept heap dropped before each call). Run from the repository root with PYTHONPATH=$PWD."""
import random, statistics as st, time

from radixflow.radix_cache.memory_pool import PageAllocator
from radixflow.radix_cache.radix_tree import RadixCache


def walk_evict(tree: RadixCache, num_tokens: int) -> int:
    """Session 9's eviction cost: the kept heap dropped before every call, so each call walks every node."""
    tree._lru, tree._lru_late = [], []
    return tree.evict(num_tokens)


def full_tree(n_leaves: int, rng: random.Random, seg: int = 16):
    base = [rng.randrange(1, 30000) for _ in range(64)]
    alloc = PageAllocator(n_leaves * seg + 66, 1)  # the shared 64 tokens, then n_leaves leaves of seg
    tree = RadixCache(alloc, 1)
    while True:
        k = base[: rng.randrange(8, 64)] + [rng.randrange(1, 30000) for _ in range(seg)]
        pages = alloc.alloc(len(k))
        if pages is None:
            return tree, alloc, base
        slots = alloc.slots_of(pages)
        alloc.free_slots(slots[: tree.insert(k, slots)])


def steps_ms(n_leaves: int, evict, steps: int = 30) -> tuple[float, int]:
    rng = random.Random(0)
    tree, alloc, base = full_tree(n_leaves, rng)
    nodes = sum(1 for _ in tree.nodes())
    ts = []
    for _ in range(steps):
        k = base[:8] + [rng.randrange(1, 30000) for _ in range(16)]
        t = time.perf_counter()
        m = tree.match_prefix(k)
        need = len(k) - m.length
        if alloc.num_free_slots < need:
            evict(tree, need - alloc.num_free_slots)
        slots = alloc.slots_of(alloc.alloc(need))
        tree.insert(k, __import__("torch").cat([m.slots, slots]))
        ts.append(time.perf_counter() - t)
    return 1000 * st.median(ts), nodes


if __name__ == "__main__":
    for n in (100, 1000, 10000, 100000):
        new, nodes = steps_ms(n, RadixCache.evict)
        old, _ = steps_ms(n, walk_evict)
        print(f"{nodes} nodes: a full-pool step (match, evict, insert) {old:.3f} ms walking every call, {new:.3f} ms now "
              f"({old / new:.0f}x)", flush=True)
