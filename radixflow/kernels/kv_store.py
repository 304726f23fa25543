"""Triton KV store: write the new tokens' K and V into the pool at their slots, in one launch.

Reference: `reference.store_kv_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixflow.kernels.attention_common import to_kv_dtype
from radixflow.kernels.pdl import pdl_launch, pdl_wait
from radixflow.kernels.settings import DEFAULT_KERNEL_SETTINGS, KernelSettings


@triton.jit
def _store_kv_kernel(
    K, V, KBuf, VBuf, Loc, KScale, VScale,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_bt, stride_bh,
    H, D,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, KV_FP8: tl.constexpr, USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(Loc + t).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)[:, None]
    offs_d = tl.arange(0, BLOCK_D)[None, :]
    mask = (offs_h < H) & (offs_d < D)
    dst = slot * stride_bt + offs_h * stride_bh + offs_d
    k = tl.load(K + t * stride_kt + offs_h * stride_kh + offs_d, mask=mask)
    head = tl.minimum(offs_h, H - 1)  # the scales of masked-off heads are never used
    tl.store(KBuf + dst, to_kv_dtype(k, KScale, head, KV_FP8, KBuf.dtype.element_ty), mask=mask)
    v = tl.load(V + t * stride_vt + offs_h * stride_vh + offs_d, mask=mask)
    tl.store(VBuf + dst, to_kv_dtype(v, VScale, head, KV_FP8, VBuf.dtype.element_ty), mask=mask)


def store_kv(k_buf: torch.Tensor, v_buf: torch.Tensor, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             scales: tuple[torch.Tensor, torch.Tensor] | None = None,
             settings: KernelSettings = DEFAULT_KERNEL_SETTINGS) -> None:
    """k_buf/v_buf: [S, H, D] contiguous pool buffers; k/v: [T, H, D] views; loc: [T] slots.
    FP8 buffers need `scales` (k_scale, v_scale: float32 [H]): the pool holds k / k_scale, v / v_scale."""
    t, h, d = k.shape
    assert k_buf.is_contiguous() and v_buf.is_contiguous() and k.stride(2) == 1 and v.stride(2) == 1
    fp8 = k_buf.dtype == torch.float8_e4m3fn
    assert scales is not None or not fp8
    k_scale, v_scale = scales if fp8 else (loc, loc)  # unused unless FP8
    if t:
        _store_kv_kernel[(t,)](
            k, v, k_buf, v_buf, loc, k_scale, v_scale,
            k.stride(0), k.stride(1), v.stride(0), v.stride(1), k_buf.stride(0), k_buf.stride(1),
            h, d,
            BLOCK_H=triton.next_power_of_2(h), BLOCK_D=triton.next_power_of_2(d), KV_FP8=fp8, num_warps=4,
            **pdl_launch(k, settings),
        )
