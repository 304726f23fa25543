"""Triton helpers shared by the decode and extend attention kernels.

With 16-bit K/V the softmax weights p (float32) must be rounded to 16 bits for the tensor-core
p @ v. Rounded once, p carries an error of up to 2^-9 of itself into every attention output,
and two kernels that tile the softmax differently round different values: at the Llama-3-8B
shape that alone moved logprobs by ~0.05 (benchmarks/bf16_error_sources.py). So p is split into
a 16-bit high part and the 16-bit remainder, and both are multiplied: ~2^-17 relative error for
a second MMA over the same v tile (`split_p`; `set_split_p(False)` restores the single rounding).
On an H200 it brought Triton vs torch-native bf16 logprobs at the Llama-3-8B shape from 0.186 to
0.119 (max) for 0.4% of batch-1 decode time and 1.5-3% of prefill (BENCHMARKS.md, session 10).
"""

from __future__ import annotations

import triton
import triton.language as tl

_split_p = True


def set_split_p(on: bool) -> bool:
    """Kernels launched from now on multiply p as high + low 16-bit parts (True) or rounded once;
    returns the previous setting. Captured CUDA graphs keep theirs."""
    global _split_p
    before, _split_p = _split_p, on
    return before


def split_p(dtype) -> bool:
    """The SPLIT_P launch flag for attention over K/V of `dtype` (float32 needs no split)."""
    import torch

    return _split_p and dtype in (torch.bfloat16, torch.float16)


@triton.jit
def dot(a, b, IEEE: tl.constexpr):
    """a @ b; IEEE keeps float32 inputs in full precision (no TF32)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def online_softmax_step(qk, v, m_i, l_i, acc, IEEE: tl.constexpr, SPLIT_P: tl.constexpr):
    """Fold one block of scaled, masked scores qk [M, N] and values v [N, D] into the
    running max m_i, denominator l_i and unnormalised output acc."""
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    p_hi = p.to(v.dtype)
    acc += dot(p_hi, v, IEEE)
    if SPLIT_P:
        acc += dot((p - p_hi.to(tl.float32)).to(v.dtype), v, IEEE)
    return m_new, l_i, acc


@triton.jit
def load_kv_block(Slots, offs_n, mask_n, K, V, stride_kt, stride_vt, offs_d, mask_d):
    """Gather a block of tokens' K (as [D, N], ready for q @ k) and V ([N, D]) of one KV
    head through its req_to_token row `Slots`; K and V point at that head."""
    slot = tl.load(Slots + offs_n, mask=mask_n, other=0).to(tl.int64)
    k = tl.load(K + slot[None, :] * stride_kt + offs_d[:, None], mask=mask_n[None, :] & mask_d[:, None], other=0.0)
    v = tl.load(V + slot[:, None] * stride_vt + offs_d[None, :], mask=mask_n[:, None] & mask_d[None, :], other=0.0)
    return k, v
