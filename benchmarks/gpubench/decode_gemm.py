"""Section decode_gemm: the bf16 linear layers at decode batches (16..200 rows), cuBLAS against the alternatives.

Per Llama-3-8B weight shape and M: `F.linear` (cuBLAS, what the engine runs above the GEMV's rows), the same
through cuBLASLt (kernels/blas_choice.py), the batch-invariant Triton GEMM (kernels/matmul.py) and the split-K
Triton GEMM (kernels/skinny_gemm.py) in each of its candidate configs. us per call in a CUDA graph with the
weights rotating over copies that outgrow the L2 (as 32 layers do), against the bound: the weight, x and out
bytes at the measured read bandwidth (READ_TBS) or the dense bf16 FLOPs at MMA_TFLOPS, whichever is higher.
Every Triton result is checked against cuBLAS first.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gpubench.common import free, log
from gpubench.fp8_kernels import L2
from gpubench.gemm_shapes import _cublaslt

SHAPES = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
MS = (16, 40, 64, 128, 200)
READ_TBS = 4.38  # the H200's measured read bandwidth (benchmarks/read_bandwidth.py)
MMA_TFLOPS = 989.0  # bf16 dense peak


def candidates(m: int) -> list[tuple]:
    """skinny_gemm configs worth timing at m rows: (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT, warps, stages)."""
    bms = (16,) if m <= 16 else (32, 64) if m <= 32 else (64,) if m <= 64 else (64, 128)
    out = []
    for bm in bms:
        out += [(bm, 64, 128, 1, 4, 4), (bm, 64, 128, 2, 4, 4), (bm, 64, 128, 4, 4, 4), (bm, 32, 128, 4, 4, 4),
                (bm, 64, 64, 4, 4, 6), (bm, 128, 64, 2, 8, 4), (bm, 64, 128, 8, 4, 4), (bm, 128, 128, 1, 8, 3)]
    return out


def bound_us(m: int, n: int, k: int) -> float:
    bytes_ = 2 * (n * k + m * k + m * n)
    return max(bytes_ / READ_TBS / 1e6, 2 * m * n * k / MMA_TFLOPS / 1e6)


def _shape(n: int, k: int) -> dict:
    from radixflow.kernels.gemv import time_graph_us
    from radixflow.kernels.matmul import matmul_batch_invariant
    from radixflow.kernels.skinny_gemm import fits, skinny_gemm

    copies = max(2, math.ceil(2 * L2 / (2 * n * k)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    out = {}
    for m in MS:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x, weights[0]).float()
        variants = {"cublas": lambda i: F.linear(x, weights[i % copies]),
                    "cublaslt": _cublaslt(lambda i: F.linear(x, weights[i % copies])),
                    "triton_bi": lambda i: matmul_batch_invariant(x, weights[i % copies])}
        for cfg in candidates(m):
            if fits(k, cfg):
                variants["sk" + "_".join(map(str, cfg))] = lambda i, cfg=cfg: skinny_gemm(x, weights[i % copies], config=cfg)
        row: dict = {"bound_us": round(bound_us(m, n, k), 2)}
        for label, fn in variants.items():
            try:
                err = float((fn(0).float() - ref).abs().max())
                if err > 0.02 * float(ref.abs().max()):
                    row[label] = f"wrong: max diff {err:.3g}"
                    continue
                row[label] = round(time_graph_us(fn, max(copies, 8)), 2)
            except Exception as e:  # noqa: BLE001 - recorded; the other variants still run
                row[label] = repr(e)[:200]
        timed = {k_: v for k_, v in row.items() if k_.startswith("sk") and isinstance(v, float)}
        if timed:
            best = min(timed, key=timed.get)
            row["best_skinny"] = best
            row["best_skinny_vs_cublas"] = round(row["cublas"] / timed[best], 3) if isinstance(row["cublas"], float) else None
        if isinstance(row["cublas"], float):
            row["cublas_of_bound"] = round(row["bound_us"] / row["cublas"], 3)
        out[f"m{m}"] = row
        del x
    del weights
    free()
    return out


def sec_decode_gemm() -> dict:
    out = {}
    for name, (n, k) in SHAPES.items():
        out[name] = _shape(n, k)
        log(f"decode_gemm {name} {n}x{k}: " + "; ".join(
            f"{m}: cublas {r['cublas']} bound {r['bound_us']} best {r.get('best_skinny')} x{r.get('best_skinny_vs_cublas')}"
            for m, r in out[name].items()))
    return out
