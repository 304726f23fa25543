"""RMSNorm, computed in float32 like the reference implementations (a fused Triton kernel on CUDA)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    fused = False  # use the Triton kernel on CUDA tensors (set by the model runner)

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """With `residual`, returns (norm(x + residual), x + residual): the first in x's dtype,
        the second in the residual's (a bf16 model keeps its residual stream in float32)."""
        if self.fused and x.is_cuda:
            from radixflow.kernels.norm_act import rmsnorm

            return rmsnorm(x, self.weight, self.eps, residual)
        dtype = x.dtype
        if residual is not None:
            x = (x.float() + residual.float()).to(residual.dtype)  # one rounding, to the stream's dtype
            residual = x
        if dtype == torch.float32:  # one fused op; the same math as below
            out = F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
            return out if residual is None else (out, residual)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * h.to(dtype)
        return out if residual is None else (out, residual)
