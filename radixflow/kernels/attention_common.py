"""Triton helpers shared by the decode and extend attention kernels."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def dot(a, b, IEEE: tl.constexpr):
    """a @ b; IEEE keeps float32 inputs in full precision (no TF32)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def online_softmax_step(qk, v, m_i, l_i, acc, IEEE: tl.constexpr):
    """Fold one block of scaled, masked scores qk [M, N] and values v [N, D] into the
    running max m_i, denominator l_i and unnormalised output acc."""
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, IEEE)
    return m_new, l_i, acc


@triton.jit
def load_kv_block(Slots, offs_n, mask_n, K, V, stride_kt, stride_vt, offs_d, mask_d):
    """Gather a block of tokens' K (as [D, N], ready for q @ k) and V ([N, D]) of one KV
    head through its req_to_token row `Slots`; K and V point at that head."""
    slot = tl.load(Slots + offs_n, mask=mask_n, other=0).to(tl.int64)
    k = tl.load(K + slot[None, :] * stride_kt + offs_d[:, None], mask=mask_n[None, :] & mask_d[:, None], other=0.0)
    v = tl.load(V + slot[:, None] * stride_vt + offs_d[None, :], mask=mask_n[:, None] & mask_d[None, :], other=0.0)
    return k, v
