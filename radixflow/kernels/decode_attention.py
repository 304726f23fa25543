"""Triton decode attention over the paged KV pool, read through req_to_token.

One query token per request. Stage 1: a program per (request, KV head, split) runs
online softmax over its split of the sequence for the whole GQA group of query heads
at once (one K/V read serves the group) and writes a partial output with its
log-sum-exp. Stage 2 merges the splits. The number of splits is a launch constant,
independent of the sequence lengths, so the launch can be captured in a CUDA graph.
Reference: `reference.decode_attention_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixflow.kernels.attention_common import dot, load_kv_block, online_softmax_step

# Launch parameters, the best of benchmarks/gpu_bench.py's attn_tune on an H200 (2026-11-30:
# 212 us vs 276 us for the first version at 200 requests x 700 tokens, Llama-3-8B heads).
# `waves`: how many times the (request, KV head, split) programs should cover the SMs.
DECODE_CONFIG = {"block_n": 64, "num_warps": 8, "num_stages": 3, "waves": 4}


@triton.jit
def _decode_stage1(
    Q, K, V, ReqToToken, ReqIdx, SeqLens, MidO, MidLse,
    stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_r2t,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
    scale, GROUP, D,
    NUM_SPLITS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IEEE: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(SeqLens + b).to(tl.int32)
    row = tl.load(ReqIdx + b).to(tl.int64)
    split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_g = tl.arange(0, BLOCK_H)
    heads = kvh * GROUP + offs_g
    mask_h = offs_g < GROUP
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_h[:, None] & mask_d[None, :], other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        k, v = load_kv_block(ReqToToken + row * stride_r2t, offs_n, mask_n, K + kvh * stride_kh, V + kvh * stride_vh,
                             stride_kt, stride_vt, offs_d, mask_d)
        qk = tl.where(mask_n[None, :], dot(q, k.to(q.dtype), IEEE) * scale, float("-inf"))
        m_i, l_i, acc = online_softmax_step(qk, v, m_i, l_i, acc, IEEE)

    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, m_i + tl.log(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    tl.store(MidO + b * stride_mb + heads[:, None] * stride_mh + split * stride_ms + offs_d[None, :],
             out, mask=mask_h[:, None] & mask_d[None, :])
    tl.store(MidLse + b * stride_lb + heads * stride_lh + split, lse, mask=mask_h)


@triton.jit
def _decode_stage2(
    MidO, MidLse, Out,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
    D,
    NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < NUM_SPLITS
    lse = tl.load(MidLse + b * stride_lb + h * stride_lh + offs_s, mask=mask_s, other=float("-inf"))
    w = tl.exp(lse - tl.max(lse, axis=0))
    o = tl.load(MidO + b * stride_mb + h * stride_mh + offs_s[:, None] * stride_ms + offs_d[None, :],
                mask=mask_s[:, None] & (offs_d[None, :] < D), other=0.0)
    out = tl.sum(o * w[:, None], axis=0) / tl.sum(w, axis=0)
    tl.store(Out + b * stride_ob + h * stride_oh + offs_d, out.to(Out.dtype.element_ty), mask=offs_d < D)


def num_kv_splits(batch: int, kv_heads: int, num_sms: int = 132, waves: int | None = None) -> int:
    """Enough (request, head, split) programs to cover the SMs `waves` times, capped at 16."""
    waves = DECODE_CONFIG["waves"] if waves is None else waves
    want = -(-waves * num_sms // max(batch * kv_heads, 1))
    return min(16, triton.next_power_of_2(max(want, 1)))


def decode_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int,
    out: torch.Tensor | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """q: [B, Hq, D]; k_buf/v_buf: [S, Hkv, D]; returns [B, Hq, D] in q's dtype."""
    cfg = DECODE_CONFIG if config is None else config
    bsz, hq, d = q.shape
    hkv = k_buf.shape[1]
    group = hq // hkv
    out = torch.empty_like(q) if out is None else out
    if bsz == 0:
        return out
    mid_o = torch.empty((bsz, hq, num_splits, d), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((bsz, hq, num_splits), dtype=torch.float32, device=q.device)
    block_d = triton.next_power_of_2(d)
    _decode_stage1[(bsz, hkv, num_splits)](
        q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, mid_o, mid_lse,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        req_to_token.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        scale, group, d,
        NUM_SPLITS=num_splits, BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_N=cfg["block_n"],
        BLOCK_D=block_d, IEEE=q.dtype == torch.float32, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    _decode_stage2[(bsz, hq)](
        mid_o, mid_lse, out,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        d,
        NUM_SPLITS=num_splits, BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_d, num_warps=4,
    )
    return out
