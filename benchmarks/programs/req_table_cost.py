"""The host's cost of one extend pass's req_to_token work, per request (no model, no GPU): for N requests
each with a P-token cached prefix and E new tokens, what admission, the pass and the tree do to the table's
host copy (write the prefix, write the new slots, read them back for the pass, write the tree's slots, read
the request's own slots, read one cell), the pass's position and slot inputs, and the flush's packing of
the written ranges into one array. Timed two ways in the same process: through ReqToTokenPool (a numpy
array over the host copy) and through torch slicing as before session 18 (the baseline, inlined here).

    python benchmarks/programs/req_table_cost.py --requests 64,512 --prefix 1900 --new 20
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from radixflow.radix_cache.memory_pool import ReqToTokenPool
from radixflow.runtime.scheduling.forward_inputs import concat_ranges


def pool_pass(pool: ReqToTokenPool, n: int, pre: torch.Tensor, new: torch.Tensor) -> None:
    p, e = pre.numel(), new.numel()
    for r in range(n):
        pool.write(r, 0, pre)
        pool.write(r, p, new)
    concat_ranges([p] * n, [e] * n)
    pool.read_spans([(r, p, p + e) for r in range(n)])
    for r in range(n):
        pool.write(r, p, new)
        pool.read(r, p + e, start=p)
        pool.read_at(r, p + e - 1)
    pool._spans = []  # the flush's packing is timed apart


def torch_pass(host: torch.Tensor, n: int, pre: torch.Tensor, new: torch.Tensor) -> None:
    p, e = pre.numel(), new.numel()
    pos, locs = [], []
    for r in range(n):
        host[r, :p] = pre.to(torch.int32)
        host[r, p : p + e] = new.to(torch.int32)
        pos.append(torch.arange(p, p + e))
        locs.append(host[r, p : p + e].to(torch.int64))
    torch.cat(pos), torch.cat(locs)
    for r in range(n):
        host[r, p : p + e] = new.to(torch.int32)
        host[r, p : p + e].to(torch.int64)
        int(host[r, p + e - 1])


def packing(pool: ReqToTokenPool, n: int, width: int) -> tuple[float, float]:
    """The flush's host part for n rows of `width` cells: the pool's (numpy) against torch.cat of row slices."""
    ranges = {r: (0, width) for r in range(n)}
    t = time.perf_counter()
    pool.packed(ranges)
    t1 = time.perf_counter()
    torch.cat([pool.host[r, lo:hi] for r, (lo, hi) in ranges.items()])
    return t1 - t, time.perf_counter() - t1


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", default="64,512")
    ap.add_argument("--prefix", type=int, default=1900)
    ap.add_argument("--new", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    pre = torch.arange(args.prefix, dtype=torch.int64)
    new = torch.arange(args.new, dtype=torch.int64)
    print("| requests | pool ms a pass | torch slicing ms a pass | ratio | flush packing ms numpy / torch.cat |")
    print("| --- | --- | --- | --- | --- |")
    for n in [int(x) for x in args.requests.split(",")]:
        pool = ReqToTokenPool(n, args.prefix + args.new + 1, "cpu")
        pool.host = pool.table.clone()  # a host copy apart from the table, as on a GPU
        a, b, pk, pt = [], [], [], []
        for _ in range(args.repeats):  # interleaved
            t = time.perf_counter()
            pool_pass(pool, n, pre, new)
            a.append(time.perf_counter() - t)
            t = time.perf_counter()
            torch_pass(pool.host, n, pre, new)
            b.append(time.perf_counter() - t)
            x, y = packing(pool, n, args.prefix + args.new)
            pk.append(x)
            pt.append(y)
        ma, mb = statistics.median(a) * 1000, statistics.median(b) * 1000
        print(f"| {n} | {ma:.2f} | {mb:.2f} | {mb / ma:.2f}x | {statistics.median(pk) * 1000:.2f} / {statistics.median(pt) * 1000:.2f} |")


if __name__ == "__main__":
    main()
