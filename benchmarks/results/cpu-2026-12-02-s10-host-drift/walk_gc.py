"""(Session 10, issue 29.) One walk of a 10^5-node tree for its unlocked leaves: a heap of the nodes (session 9), a heap of
(last_access, tie, node) tuples (this session's first version), and the same with the collector off. Run from the repository
root with PYTHONPATH=$PWD."""
import gc, time, random, sys
sys.path.insert(0, "benchmarks/results/cpu-2026-12-02-s10-host-drift")
from evict_scale import full_tree
import heapq
from radixflow.radix_cache.radix_tree import _clock
tree, alloc, base = full_tree(100000, random.Random(0))  # 103,053 nodes
for label in ("nodes only (old)", "tuples (new)", "tuples, gc off", "nodes only (old)", "tuples (new)"):
    t = time.perf_counter()
    if label.startswith("nodes"):
        h = [n for n in tree._leaves() if n.lock_ref == 0]; heapq.heapify(h)
    else:
        if "off" in label: gc.disable()
        h = [(n.last_access, next(_clock), n) for n in tree._leaves() if n.lock_ref == 0]; heapq.heapify(h)
        gc.enable()
    print(label, f"{1000*(time.perf_counter()-t):.1f} ms", flush=True)
