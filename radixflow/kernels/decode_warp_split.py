"""Decode attention's loop over a split with each warp on its own tokens (DECODE_CONFIG's `warp_split`).

In decode_attention's loop the warps of a program share one [16 padded GQA rows, block_n tokens] score
tile, split along the tokens: every block's row max and row sum cross warps through shared memory, and so
does p on its way to p @ v (which each warp computes for a slice of the head dimension over all the tokens).
Here the block is cut into one sub-block a warp, as a batched product [warps, 16, block_n / warps], so each
warp keeps its own running max, sum and [16, head_dim] output and the rows never leave it; the warps'
states merge once, after the loop. The price: every warp holds a whole [16, head_dim] float32 output.
Written for an FP8 pool read through float16 products (KV_F16); decode_attention has the rest.
"""

from __future__ import annotations

import triton
import triton.language as tl

from radixflow.kernels.attention_common import e4m3_to_f16_in_registers, exp2_ftz


@triton.jit
def _exp(x, EXP2: tl.constexpr):
    if EXP2:
        return exp2_ftz(x)
    return tl.exp(x)


@triton.jit
def attend_by_warp(q, Slots, start, end, K, V, stride_kt, stride_vt, offs_d, mask_d, scale,
                   WARPS: tl.constexpr, BLOCK_N: tl.constexpr, V_REGS: tl.constexpr, K_REGS: tl.constexpr,
                   EXP2: tl.constexpr):
    """(m_i, l_i, acc) of q [BLOCK_H, BLOCK_D] (float16) over the tokens start..end of the req_to_token row
    `Slots`, K / V pointing at the KV head, as decode_attention's loop leaves them (m_i in log2 units with EXP2)."""
    SUB: tl.constexpr = BLOCK_N // WARPS
    BLOCK_H: tl.constexpr = q.shape[0]
    BLOCK_D: tl.constexpr = q.shape[1]
    q3 = tl.broadcast_to(q[None, :, :], (WARPS, BLOCK_H, BLOCK_D))
    offs_w = (tl.arange(0, WARPS) * SUB)[:, None] + tl.arange(0, SUB)[None, :]  # [WARPS, SUB]: a row a warp
    m_i = tl.full([WARPS, BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([WARPS, BLOCK_H], tl.float32)
    acc = tl.zeros([WARPS, BLOCK_H, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + offs_w
        mask_n = offs_n < end
        slot = tl.load(Slots + offs_n, mask=mask_n, other=0).to(tl.int64)
        k = tl.load(K + slot[:, None, :] * stride_kt + offs_d[None, :, None],
                    mask=mask_n[:, None, :] & mask_d[None, :, None], other=0.0)
        v = tl.load(V + slot[:, :, None] * stride_vt + offs_d[None, None, :],
                    mask=mask_n[:, :, None] & mask_d[None, None, :], other=0.0)
        if V_REGS:
            v = e4m3_to_f16_in_registers(v)
        if K_REGS:
            k = e4m3_to_f16_in_registers(k)
        qk = tl.dot(q3, k.to(tl.float16)) * scale
        qk = tl.where(mask_n[:, None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=2))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)  # a warp whose tokens are all past `end`
        alpha = _exp(m_i - m_safe, EXP2)
        p = _exp(qk - m_safe[:, :, None], EXP2)
        l_i = l_i * alpha + tl.sum(p, axis=2)
        acc = acc * alpha[:, :, None] + tl.dot(p.to(tl.float16), v.to(tl.float16))
        m_i = m_new
    m = tl.max(m_i, axis=0)
    w = _exp(m_i - tl.where(m > float("-inf"), m, 0.0)[None, :], EXP2)
    return m, tl.sum(l_i * w, axis=0), tl.sum(acc * w[:, :, None], axis=0)
