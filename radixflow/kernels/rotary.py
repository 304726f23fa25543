"""Triton rotary embedding (rotate-half layout), applied in place to q and k.

References: `reference.rotary_ref`, `reference.rotary_store_kv_ref`. One program per token
handles every q and k head, so the cos/sin row is read once per token. `apply_rotary_store_kv`
also writes the rotated k and v into the KV pool (what `kv_store.store_kv` does), saving a
launch per layer; both go through one kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixflow.kernels.pdl import pdl_launch, pdl_wait
from radixflow.kernels.settings import DEFAULT_KERNEL_SETTINGS, KernelSettings


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
    y1 = (x1 * c - x2 * s).to(X.dtype.element_ty)
    y2 = (x2 * c + x1 * s).to(X.dtype.element_ty)
    tl.store(ptr, y1, mask=mask)
    tl.store(ptr + HALF, y2, mask=mask)
    return y1, y2


@triton.jit
def _rotary_store_kv_kernel(
    Q, K, V, Pos, Cos, Sin, KBuf, VBuf, Loc,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cos, stride_bt, stride_bh,
    HQ, HK, HALF,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr, STORE_KV: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """q/k of token t rotated in place; with STORE_KV also the rotated k and v into the pool at Loc[t]."""
    pdl_wait(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(Pos + t).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    c = tl.load(Cos + pos * stride_cos + offs_d, mask=offs_d < HALF, other=0.0)
    s = tl.load(Sin + pos * stride_cos + offs_d, mask=offs_d < HALF, other=0.0)
    _rotate(Q, t, c, s, stride_qt, stride_qh, HQ, HALF, BLOCK_HQ, BLOCK_D)
    k1, k2 = _rotate(K, t, c, s, stride_kt, stride_kh, HK, HALF, BLOCK_HK, BLOCK_D)
    if STORE_KV:
        slot = tl.load(Loc + t).to(tl.int64)
        offs_h = tl.arange(0, BLOCK_HK)[:, None]
        mask = (offs_h < HK) & (offs_d[None, :] < HALF)
        dst = slot * stride_bt + offs_h * stride_bh + offs_d[None, :]
        tl.store(KBuf + dst, k1.to(KBuf.dtype.element_ty), mask=mask)
        tl.store(KBuf + dst + HALF, k2.to(KBuf.dtype.element_ty), mask=mask)
        src = V + t * stride_vt + offs_h * stride_vh + offs_d[None, :]
        v1 = tl.load(src, mask=mask)
        v2 = tl.load(src + HALF, mask=mask)
        tl.store(VBuf + dst, v1.to(VBuf.dtype.element_ty), mask=mask)
        tl.store(VBuf + dst + HALF, v2.to(VBuf.dtype.element_ty), mask=mask)


def apply_rotary(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 settings: KernelSettings = DEFAULT_KERNEL_SETTINGS):
    """q: [T, Hq, D], k: [T, Hkv, D] (views with unit stride in D), modified in place and returned."""
    return _launch(positions, q, k, cos, sin, None, settings)


def apply_rotary_store_kv(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    loc: torch.Tensor,
    settings: KernelSettings = DEFAULT_KERNEL_SETTINGS,
):
    """`apply_rotary` on q/k, then the rotated k and v into k_buf/v_buf [S, Hkv, D] at slots `loc`."""
    assert v.stride(2) == 1 and k_buf.is_contiguous() and v_buf.is_contiguous()
    return _launch(positions, q, k, cos, sin, (v, k_buf, v_buf, loc), settings)


def _launch(positions, q, k, cos, sin, store: tuple | None, settings: KernelSettings):
    """One program per token; `store`: (v, k_buf, v_buf, loc) to also write the KV pool."""
    t, hq, d = q.shape
    hk = k.shape[1]
    assert q.stride(2) == 1 and k.stride(2) == 1 and cos.stride(1) == 1 and cos.dtype == torch.float32 and d % 2 == 0
    v, k_buf, v_buf, loc = store if store is not None else (k, k, k, positions)  # unused without STORE_KV
    if t:
        _rotary_store_kv_kernel[(t,)](
            q, k, v, positions, cos, sin, k_buf, v_buf, loc,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0),
            k_buf.stride(0), k_buf.stride(1),
            hq, hk, d // 2,
            BLOCK_HQ=triton.next_power_of_2(hq), BLOCK_HK=triton.next_power_of_2(hk),
            BLOCK_D=triton.next_power_of_2(d // 2), STORE_KV=store is not None, num_warps=4, **pdl_launch(q, settings),
        )
    return q, k
