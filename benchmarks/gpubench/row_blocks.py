"""Section gemm_row_blocks: a prefill chunk's linears as one GEMM per block of rows, alone.

Session 8's gemm_shapes timed every Llama-3-8B linear shape 4-8% faster at 1,024 rows than at a prefill
chunk's 8,192, which suggested cutting the chunk's GEMMs into row blocks. Session 10 timed that (here, and end
to end with an engine setting that ran the layers this way): one GEMM was faster at every shape and block, and with
blocks of 2,048 rows the offline pass's extend passes took 0.19-0.26 s more GPU time on every seed (its wall time
0.6-1.5% longer, a figure within the host side's noise) (benchmarks/history/2026-12-02.md, "Session 10, offline
bf16"), so the engine setting was removed; this section keeps the measurement. Its control, one block of all the
rows through the blocks' own call (torch.mm into a preallocated output), tells the call path's cost from blocking's.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from gpubench.common import DEV, SZ, free, log
from gpubench.fp8_kernels import L2
from gpubench.gemm_shapes import SHAPES


def row_blocked_linear(x: torch.Tensor, weight: torch.Tensor, block: int) -> torch.Tensor:
    """x @ weight.T as one GEMM per `block` rows of x, each written into its rows of one output (a contiguous
    slice: no copy); every row sees the same K reduction as in one GEMM."""
    out = torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
    for start in range(0, x.shape[0], block):
        torch.mm(x[start : start + block], weight.t(), out=out[start : start + block])
    return out


def _time_us(fn, calls: int) -> float:
    """us per fn(i) call: in a CUDA graph on CUDA (kernels/gemv.py), a wall clock on the CPU (smoke)."""
    if DEV == "cuda":
        from radixflow.kernels.gemv import time_graph_us

        return time_graph_us(fn, calls)
    t = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - t) / calls * 1e6


def _shape_blocks(n: int, k: int, m: int) -> dict:
    dtype = torch.bfloat16 if DEV == "cuda" else torch.float32
    copies = max(2, math.ceil(2 * L2 / (2 * n * k))) if DEV == "cuda" else 2
    weights = [torch.randn(n, k, device=DEV, dtype=dtype) * 0.02 for _ in range(copies)]
    x = torch.randn(m, k, device=DEV, dtype=dtype)
    ref = F.linear(x, weights[0])
    row = {"one_gemm_us": round(_time_us(lambda i: F.linear(x, weights[i % copies]), max(copies, 8)), 2)}
    for block in [b for b in SZ["rb_blocks"] if b < m] + [m]:  # m: the control, one block of every row
        fn = lambda i, b=block: row_blocked_linear(x, weights[i % copies], b)  # noqa: E731
        # the same rows and K reduction; cuBLAS could pick another kernel at a smaller M, yet session 10's H200
        # run found every block bit-equal to one GEMM (max_diff 0.0)
        key = "one_block" if block == m else f"rows{block}"
        row[f"{key}_max_diff"] = float((fn(0).float() - ref.float()).abs().max())
        row[f"{key}_us"] = round(_time_us(fn, max(copies, 8)), 2)
    for key in [k for k in row if k.endswith("_us")]:
        row[key.replace("_us", "_TFLOPs")] = round(2 * m * n * k / row[key] / 1e6, 1)
    del weights, x
    free()
    return row


def sec_gemm_row_blocks() -> dict:
    """Each linear shape at the prefill chunk's rows, one GEMM against one per block of rows; the block whose
    four shapes (one of each a layer) add up to the least time is `best_block` (0: one GEMM). `one_block`:
    every row as one block through row_blocked_linear, the blocks' call path without blocking."""
    m = SZ["rb_rows"]
    shapes = SHAPES if DEV == "cuda" else {name: (n // 64, k // 64) for name, (n, k) in SHAPES.items()}
    out: dict = {"rows": m}
    for name, (n, k) in shapes.items():
        out[name] = _shape_blocks(n, k, m)
        log(f"gemm_row_blocks {name} {n}x{k} at {m} rows: {out[name]}")
    totals = {0: sum(out[s]["one_gemm_us"] for s in shapes)}
    for block in (b for b in SZ["rb_blocks"] if b < m):
        totals[block] = sum(out[s][f"rows{block}_us"] for s in shapes)
    out["layer_us"] = {str(b): round(t, 1) for b, t in totals.items()}
    out["best_block"] = min(totals, key=totals.get)
    out["layer_us"]["one_block"] = round(sum(out[s]["one_block_us"] for s in shapes), 1)  # the control: not a choice
    return out
