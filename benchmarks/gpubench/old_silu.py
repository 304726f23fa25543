"""The interleaved SiLU-and-mul kernel as session 11 shipped it (two stride-2 loads), for prefill_kernels' A/B.

kernels/norm_act.py now loads each pair in one contiguous load and splits it in registers; this copy stays so
a GPU call can time the two side by side. Imported lazily (it imports triton)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _old_silu_mul_kernel(X, Out, stride_x, stride_o, N, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    g = tl.load(X + row * stride_x + 2 * offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(X + row * stride_x + 2 * offs + 1, mask=mask, other=0.0).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(Out.dtype.element_ty).to(tl.float32)
    tl.store(Out + row * stride_o + offs, (s * u).to(Out.dtype.element_ty), mask=mask)


def old_silu_interleaved(x: torch.Tensor) -> torch.Tensor:
    """silu(x[:, 0::2]) * x[:, 1::2] through the old kernel, launched as silu_and_mul launches (no PDL)."""
    n = x.shape[1] // 2
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    block = min(triton.next_power_of_2(n), 2048)
    _old_silu_mul_kernel[(x.shape[0], triton.cdiv(n, block))](x, out, x.stride(0), out.stride(0), n, BLOCK=block,
                                                              num_warps=max(1, min(16, block // 256)))
    return out
