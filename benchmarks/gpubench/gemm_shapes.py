"""Section gemm_shapes: the bf16 linear layers' GEMMs (Llama-3-8B shapes) in other forms, alone.

At decode-sized M and a prefill chunk's, each shape as the engine runs it (`F.linear`, cuBLAS) against:
the weight's rows in two GEMMs into the halves of one output (for the merged gate/up projection: gate
and up apart); the weight stored transposed (a K x N product, another cuBLAS layout); and `F.linear`
with cuBLASLt as torch's preferred BLAS. us per call in a CUDA graph, weights rotating over copies that
outgrow the L2, and the largest difference from `F.linear`'s output.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gpubench.common import free, log
from gpubench.fp8_kernels import L2

SHAPES = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
MS = (544, 1024, 8192)


def split_linear(x: torch.Tensor, weight: torch.Tensor, parts: int) -> torch.Tensor:
    """x @ weight.T as `parts` GEMMs over equal blocks of weight rows, each written into its columns of one
    output (cuBLAS takes the column slice's row stride as is: no copy)."""
    n = weight.shape[0] // parts
    out = torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
    for i in range(parts):
        torch.mm(x, weight[i * n : (i + 1) * n].t(), out=out[:, i * n : (i + 1) * n])
    return out


def _shape_rates(n: int, k: int) -> dict:
    from radixflow.kernels.blas_choice import linear_lt
    from radixflow.kernels.gemv import time_graph_us

    copies = max(2, math.ceil(2 * L2 / (2 * n * k)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    transposed = [w.t().contiguous() for w in weights]
    out = {}
    for m in MS:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        variants = {
            "linear": lambda i: F.linear(x, weights[i % copies]),
            "split2": lambda i: split_linear(x, weights[i % copies], 2),
            "kn_layout": lambda i: torch.mm(x, transposed[i % copies]),
            "cublaslt": lambda i: linear_lt(x, weights[i % copies]),
        }
        ref = F.linear(x, weights[0]).float()
        row: dict = {}
        for label, fn in variants.items():
            try:
                row[f"{label}_max_diff"] = float((fn(0).float() - ref).abs().max())
                us = time_graph_us(fn, max(copies, 8))
            except Exception as e:  # noqa: BLE001 - recorded; the other variants still run
                row[label] = repr(e)[:200]
                continue
            row[label] = round(us, 2)
            row[f"{label}_TFLOPs"] = round(2 * m * n * k / us / 1e6, 1)
        out[f"m{m}"] = row
        del x
    del weights, transposed
    free()
    return out


def sec_gemm_shapes() -> dict:
    out = {}
    for name, (n, k) in SHAPES.items():
        out[name] = _shape_rates(n, k)
        log(f"gemm_shapes {name} {n}x{k}: {out[name]}")
    return out
