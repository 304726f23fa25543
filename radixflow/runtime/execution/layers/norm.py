"""RMSNorm, computed in float32 like the reference implementations (a fused Triton kernel on CUDA)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixflow.kernels.settings import KernelSettings


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.kernels: KernelSettings | None = None  # the Triton kernel, so launched, on CUDA tensors (the model runner's)
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
                quantize: bool = False):
        """With `residual`, returns (norm(x + residual), x + residual): the first in x's dtype (or out_dtype),
        the second in the residual's (a bf16 model keeps its residual stream in float32). quantize: the first
        as FP8 rows for an FP8 GEMM (kernels/fp8.Fp8Rows), where the Triton kernel runs; ignored elsewhere."""
        if self.kernels is not None and x.is_cuda:
            from radixflow.kernels.norm_act import rmsnorm

            return rmsnorm(x, self.weight, self.eps, residual, self.kernels, out_dtype, quantize=quantize)
        dtype = x.dtype if out_dtype is None else out_dtype
        if residual is not None:
            x = (x.float() + residual.float()).to(residual.dtype)  # one rounding, to the stream's dtype
            residual = x
        if dtype == torch.float32 == x.dtype:  # one fused op; the same math as below
            out = F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
            return out if residual is None else (out, residual)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * h.to(dtype)
        return out if residual is None else (out, residual)
