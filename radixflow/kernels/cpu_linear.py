"""float32 linear layers on CPU through oneDNN instead of torch's default BLAS.

torch sends a float32 `F.linear` on CPU to its BLAS (MKL in the x86 wheels). MKL picks its
code path by CPU vendor, so on AMD processors with AVX-512 it runs AVX2 kernels, while
oneDNN picks by instruction set (its brgemm matmul uses AVX-512 wherever the CPU has it).
Both compute in float32 with float32 accumulation; only the summation order differs.
On a 2-core AMD EPYC (Zen 5) oneDNN ran the default model's linear layers 1.5-4x faster
and its output head (49k x 576) 3-6x faster (benchmarks/history/2026-12-01.md).

`linear` falls back to `F.linear` for anything else (other dtypes, CUDA, a torch without
oneDNN) and for good after the first oneDNN call that fails.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias), through oneDNN for float32 CPU tensors."""
    global _ONEDNN
    if _ONEDNN and x.dtype == torch.float32 and weight.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2:
        try:
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
        except RuntimeError as e:
            _ONEDNN = False
            log.warning("oneDNN linear failed (%s): float32 CPU linears use F.linear", e)
    return F.linear(x, weight, bias)
