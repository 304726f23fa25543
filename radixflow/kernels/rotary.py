"""Triton rotary embedding (rotate-half layout), applied in place to q and k.

Reference: `reference.rotary_ref`. One program per token handles every q and k head,
so the cos/sin row is read once per token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate(X, t, pos_cos, pos_sin, stride_t, stride_h, H, HALF, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < H) & (offs_d[None, :] < HALF)
    ptr = X + t * stride_t + offs_h[:, None] * stride_h + offs_d[None, :]
    x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + HALF, mask=mask, other=0.0).to(tl.float32)
    c = pos_cos[None, :]
    s = pos_sin[None, :]
    tl.store(ptr, (x1 * c - x2 * s).to(X.dtype.element_ty), mask=mask)
    tl.store(ptr + HALF, (x2 * c + x1 * s).to(X.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    Q, K, Pos, Cos, Sin,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cos,
    HQ, HK, HALF,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(Pos + t).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    c = tl.load(Cos + pos * stride_cos + offs_d, mask=offs_d < HALF, other=0.0)
    s = tl.load(Sin + pos * stride_cos + offs_d, mask=offs_d < HALF, other=0.0)
    _rotate(Q, t, c, s, stride_qt, stride_qh, HQ, HALF, BLOCK_HQ, BLOCK_D)
    _rotate(K, t, c, s, stride_kt, stride_kh, HK, HALF, BLOCK_HK, BLOCK_D)


def apply_rotary(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """q: [T, Hq, D], k: [T, Hkv, D] (views with unit stride in D), modified in place and returned."""
    t, hq, d = q.shape
    hk = k.shape[1]
    assert q.stride(2) == 1 and k.stride(2) == 1 and cos.stride(1) == 1 and cos.dtype == torch.float32
    if t:
        _rotary_kernel[(t,)](
            q, k, positions, cos, sin,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0),
            hq, hk, d // 2,
            BLOCK_HQ=triton.next_power_of_2(hq), BLOCK_HK=triton.next_power_of_2(hk),
            BLOCK_D=triton.next_power_of_2(d // 2), num_warps=4,
        )
    return q, k
