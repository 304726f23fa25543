"""float32 linear layers on CPU through oneDNN instead of torch's default BLAS.

torch sends a float32 `F.linear` on CPU to its BLAS (MKL in the x86 wheels), which chooses
its code path by CPU vendor: on AMD processors with AVX-512 it runs far below oneDNN, whose
brgemm matmul picks AVX-512 by instruction set (ONEDNN_VERBOSE=1 shows brg_matmul:avx512_core).
Both compute in float32 with float32 accumulation; only the summation order differs. The
gap is widest on the output head (a vocabulary of rows), which every decode step runs
(measurements: benchmarks/history/2026-12-01.md, "CPU offline vs transformers").

`linear` falls back to `F.linear` for anything else (other dtypes, CUDA, a torch without
oneDNN), while `enabled` is False (benchmarks set it for an A/B against torch's path), and
for good after the first oneDNN call that fails.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

enabled = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias), through oneDNN for float32 CPU tensors while `enabled`."""
    global enabled
    if enabled and x.dtype == torch.float32 and weight.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2:
        try:
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
        except RuntimeError as e:
            enabled = False
            log.warning("oneDNN linear failed (%s): float32 CPU linears use F.linear", e)
    return F.linear(x, weight, bias)
