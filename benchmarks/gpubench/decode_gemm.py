"""Section decode_gemm: the bf16 linear layers at decode batches (16..200 rows), cuBLAS against the alternatives.

Per Llama-3-8B weight shape and M: `F.linear` (cuBLAS, what the engine runs above the GEMV's rows), the same
through cuBLASLt (kernels/blas_choice.py) and the batch-invariant Triton GEMM (kernels/matmul.py); a split-K
Triton GEMM (commit 03d820c) timed 0.59-1.07x cuBLAS here in session 22 and was removed. us per call in a CUDA
graph with the weights rotating over copies that outgrow the L2 (as 32 layers do), against the bound: the
weight, x and out bytes at the measured read bandwidth (READ_TBS) or the dense bf16 FLOPs at MMA_TFLOPS,
whichever is higher.
Every Triton result is checked against cuBLAS first.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gpubench.common import free, log
from gpubench.fp8_kernels import L2
from gpubench.gemm_shapes import SHAPES

MS = (16, 40, 64, 128, 200)
READ_TBS = 4.38  # the H200's measured read bandwidth (benchmarks/read_bandwidth.py)
MMA_TFLOPS = 989.0  # bf16 dense peak


def bound_us(m: int, n: int, k: int) -> float:
    bytes_ = 2 * (n * k + m * k + m * n)
    return max(bytes_ / READ_TBS / 1e6, 2 * m * n * k / MMA_TFLOPS / 1e6)


def _shape(n: int, k: int) -> dict:
    from radixflow.kernels.blas_choice import linear_lt
    from radixflow.kernels.gemv import time_graph_us
    from radixflow.kernels.matmul import matmul_batch_invariant

    copies = max(2, math.ceil(2 * L2 / (2 * n * k)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    out = {}
    for m in MS:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x, weights[0]).float()
        variants = {"cublas": lambda i: F.linear(x, weights[i % copies]),
                    "cublaslt": lambda i: linear_lt(x, weights[i % copies]),
                    "triton_bi": lambda i: matmul_batch_invariant(x, weights[i % copies])}
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
        row["fastest"] = min((k_ for k_ in variants if isinstance(row[k_], float)), key=row.get, default=None)
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
            f"{m}: bound {r['bound_us']} cublas {r['cublas']} cublaslt {r['cublaslt']} triton_bi {r['triton_bi']}"
            for m, r in out[name].items()))
    return out
