"""Tile configs for the batch-invariant matmul (kernels/matmul.py) on the GPU: for each candidate,
whether its rows are the same bits as LARGE's (the order must not change across the switch),
and its time in a CUDA graph at decode-sized M on Llama-3-8B shapes, against cuBLAS.

    python3 benchmarks/matmul_bi_bench.py --out $OUT/matmul_bi.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from radixflow.kernels.gemv import capture_graph, replay_us  # noqa: E402
from radixflow.kernels.matmul import LARGE, matmul_batch_invariant  # noqa: E402

SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]  # qkv, o_proj, gate_up, down
CALLS = 8  # matmuls per captured graph
CANDIDATES = [(64, 32, 64, 4, 6), (64, 64, 64, 4, 4), (64, 32, 64, 4, 4), (64, 16, 64, 4, 6), (16, 32, 64, 4, 6), (16, 64, 64, 4, 4),
              (32, 32, 64, 4, 6), (64, 32, 128, 4, 4)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="/tmp/matmul_bi.json")
    p.add_argument("--ms", default="1,8,64")
    a = p.parse_args()
    torch.manual_seed(0)
    rows = []
    for n, k in SHAPES:
        w = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
        x = torch.randn(300, k, device="cuda", dtype=torch.bfloat16)
        wide = matmul_batch_invariant(x, w, config=LARGE)
        for m in map(int, a.ms.split(",")):
            xm = x[:m].contiguous()
            row = {"n": n, "k": k, "m": m,
                   "cublas_us": round(replay_us(capture_graph(lambda i: F.linear(xm, w), CALLS), CALLS), 1)}
            for cfg in CANDIDATES:
                same = torch.equal(matmul_batch_invariant(xm, w, config=cfg), wide[:m])
                us = replay_us(capture_graph(lambda i, cfg=cfg: matmul_batch_invariant(xm, w, config=cfg), CALLS), CALLS)
                row[str(cfg)] = {"us": round(us, 1), "same_bits_as_large": same}
            rows.append(row)
            print(json.dumps(row))
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
