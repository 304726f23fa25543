"""Triton decode attention over the paged KV pool, read through req_to_token.

One query token per request. Stage 1: a program per (request, KV head, split) runs online
softmax over its split of the sequence for the KV head's whole GQA group of query heads at
once (one K/V read serves the group; tl.dot pads the group to 16 rows) and writes a partial
output with its log-sum-exp. Stage 2 merges the splits. The number of splits and every other
launch parameter depend on the batch size and head counts only, never on sequence lengths, so
the launch can be captured in a CUDA graph; how a sequence is cut into its splits is computed
in-kernel. The launch parameters and how a launch picks them: kernels/decode_config.py.

With `rope` (small decode batches, runtime/execution/attention/triton_backend.py), stage 1 also does what
the rotary + KV-store kernel would: each program rotates its q heads, and the program whose split
holds the new token rotates its k and stores k and v in the pool before reading the split.

Both kernels are launched with PDL (kernels/pdl.py); every input is written by earlier
kernels, so each program waits before its first load. Reference: `reference.decode_attention_ref`
(with `rope`: `reference.rotary_store_kv_ref`, then it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixflow.kernels.attention_common import (
    as_f16_pow2, dot, e4m3_to_f16_in_registers, load_kv_block, online_softmax_step, p_parts, to_kv_dtype,
)
from radixflow.kernels.decode_config import (  # noqa: F401 (the config's names, re-exported for callers)
    DECODE_CONFIG, DETERMINISTIC_CONFIG, ENTRY_GATES, FALLBACKS, LAUNCH_KEYS, POOL_ENTRIES, POOL_GATES, POOL_KINDS,
    _check_keys, entry_fits, num_kv_splits, pool_kind, resolve_config,
)
from radixflow.kernels.pdl import pdl_launch, pdl_wait
from radixflow.kernels.settings import DEFAULT_KERNEL_SETTINGS, KernelSettings


@triton.jit
def _rotate_half(X, offs_d, mask, c, s, D):
    """Rotary on rows of X at columns offs_d (rotate-half layout: d pairs with d +- D/2), in
    float32, rounded to X's dtype as the rotary kernel rounds it. c / s: cos / sin at offs_d."""
    first = offs_d < D // 2
    x = tl.load(X + offs_d, mask=mask, other=0.0).to(tl.float32)
    partner = tl.load(X + tl.where(first, offs_d + D // 2, offs_d - D // 2), mask=mask, other=0.0).to(tl.float32)
    return (x * c + tl.where(first, -partner, partner) * s).to(X.dtype.element_ty)


@triton.jit
def _decode_stage1(
    Q, K, V, ReqToToken, ReqIdx, SeqLens, MidO, MidLse, Out,
    Pos, Cos, Sin, KNew, VNew, Loc, KScale, VScale,
    stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_r2t,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
    stride_cos, stride_knb, stride_knh, stride_vnb, stride_vnh,
    scale, num_splits, split_align, D,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DIRECT: tl.constexpr, ROPE: tl.constexpr, IEEE: tl.constexpr, P_PARTS: tl.constexpr, KV_FP8: tl.constexpr,
    KV_F16: tl.constexpr, V_REGS: tl.constexpr, EXP2: tl.constexpr, USE_PDL: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    pdl_wait(USE_PDL)
    if KV_FP8:  # the pool holds K / k_scale: fold the head's scale into the softmax scale (V's: into the output)
        scale = scale * tl.load(KScale + kvh)
    seq_len = tl.load(SeqLens + b).to(tl.int32)
    row = tl.load(ReqIdx + b).to(tl.int64)
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), split_align) * split_align
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    heads = kvh * GROUP + offs_h
    mask_h = offs_h < GROUP
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    q_ptrs = Q + b * stride_qb + heads[:, None] * stride_qh
    if ROPE:  # q and the new token's k arrive unrotated; k and v are not in the pool yet
        pos = tl.load(Pos + b).to(tl.int64)
        c = tl.load(Cos + pos * stride_cos + offs_d, mask=mask_d, other=0.0)
        s = tl.load(Sin + pos * stride_cos + offs_d, mask=mask_d, other=0.0)
        q = _rotate_half(q_ptrs, offs_d[None, :], mask_h[:, None] & mask_d[None, :], c[None, :], s[None, :], D)
        if (seq_len - 1 >= start) & (seq_len - 1 < end):  # this program attends to the new token
            slot = tl.load(Loc + b).to(tl.int64)
            k_new = _rotate_half(KNew + b * stride_knb + kvh * stride_knh, offs_d, mask_d, c, s, D)
            tl.store(K + slot * stride_kt + kvh * stride_kh + offs_d,
                     to_kv_dtype(k_new, KScale, kvh, KV_FP8, K.dtype.element_ty), mask=mask_d)
            v_new = tl.load(VNew + b * stride_vnb + kvh * stride_vnh + offs_d, mask=mask_d)
            tl.store(V + slot * stride_vt + kvh * stride_vh + offs_d,
                     to_kv_dtype(v_new, VScale, kvh, KV_FP8, V.dtype.element_ty), mask=mask_d)
            tl.debug_barrier()  # the stores are visible to the whole program before the loop reads them
    else:
        q = tl.load(q_ptrs + offs_d[None, :], mask=mask_h[:, None] & mask_d[None, :], other=0.0)
    if KV_F16:  # FP8 pool, 16-bit q: products in float16 (attention_common.as_f16_pow2)
        q, q_unit = as_f16_pow2(q)
        scale = scale * q_unit
    if EXP2:  # scores in log2 units (attention_common.exp2_ftz)
        scale = scale * 1.4426950408889634
    Slots = ReqToToken + row * stride_r2t
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        k, v = load_kv_block(Slots, offs_n, mask_n, K + kvh * stride_kh, V + kvh * stride_vh, stride_kt, stride_vt,
                             offs_d, mask_d)
        if V_REGS:  # FP8 pool: V widened before shared memory (attention_common.e4m3_to_f16_in_registers)
            v = e4m3_to_f16_in_registers(v)
        qk = dot(q, k.to(q.dtype), IEEE) * scale
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        m_i, l_i, acc = online_softmax_step(qk, v.to(q.dtype), m_i, l_i, acc, IEEE, P_PARTS, EXP2)
    if EXP2:
        m_i = m_i * 0.6931471805599453  # back to natural-log units for the log-sum-exp
    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    if KV_FP8:
        out *= tl.load(VScale + kvh)
    mask_o = mask_h[:, None] & mask_d[None, :]
    if DIRECT:
        tl.store(Out + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(Out.dtype.element_ty), mask=mask_o)
    else:
        lse = tl.where(nonempty, m_i + tl.log(tl.where(nonempty, l_i, 1.0)), float("-inf"))
        tl.store(MidO + b * stride_mb + heads[:, None] * stride_mh + split * stride_ms + offs_d[None, :],
                 out, mask=mask_o)
        tl.store(MidLse + b * stride_lb + heads * stride_lh + split, lse, mask=mask_h)


@triton.jit
def _decode_stage2(
    MidO, MidLse, Out,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
    num_splits, D,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr,
):
    """One (request, query head): the splits' partial outputs weighted by exp(lse), merged in
    float32 BLOCK_S splits at a time. Empty splits (lse -inf, output 0) are read too: loading
    the outputs without waiting for the lse saves a dependent round trip."""
    b = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) + tl.arange(0, 1)
    pdl_wait(USE_PDL)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    m = tl.full([1], float("-inf"), tl.float32)
    l = tl.zeros([1], tl.float32)
    acc = tl.zeros([1, BLOCK_D], tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        mask = (heads >= 0)[:, None] & (offs_s < num_splits)[None, :]
        lse = tl.load(MidLse + b * stride_lb + heads[:, None] * stride_lh + offs_s[None, :], mask=mask,
                      other=float("-inf"), cache_modifier=".cg")
        ptrs = MidO + b * stride_mb + heads[:, None, None] * stride_mh + offs_s[None, :, None] * stride_ms
        o = tl.load(ptrs + offs_d[None, None, :], mask=mask[:, :, None] & mask_d[None, None, :], other=0.0,
                    cache_modifier=".cg")
        m_new = tl.maximum(m, tl.max(lse, axis=1))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)
        alpha = tl.exp(m - m_safe)
        w = tl.exp(lse - m_safe[:, None])
        l = l * alpha + tl.sum(w, axis=1)
        acc = acc * alpha[:, None] + tl.sum(o * w[:, :, None], axis=1)
        m = m_new
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(Out + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=mask_d[None, :])


@dataclass
class DecodeRope:
    """Rotary inputs for `decode_attention` to apply itself: per request its position, the new
    token's unrotated k and its v ([B, Hkv, D] views) and its KV slot; cos / sin: [max_pos, D] float32."""

    positions: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    loc: torch.Tensor


def _partials(out: torch.Tensor, num_splits: int, direct: bool) -> tuple:
    """Stage 1's float32 partial outputs [B, Hq, splits, D] and log-sum-exps [B, Hq, splits] with
    their strides; with `direct` none (`out` stands in for the unused pointers)."""
    if direct:
        return out, out, (0,) * 5
    bsz, hq, d = out.shape
    mid_o = torch.empty((bsz, hq, num_splits, d), dtype=torch.float32, device=out.device)
    mid_lse = torch.empty((bsz, hq, num_splits), dtype=torch.float32, device=out.device)
    return mid_o, mid_lse, (*mid_o.stride()[:3], *mid_lse.stride()[:2])


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
    rope: DecodeRope | None = None,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    settings: KernelSettings = DEFAULT_KERNEL_SETTINGS,
) -> torch.Tensor:
    """q: [B, Hq, D]; k_buf/v_buf: [S, Hkv, D]; returns [B, Hq, D] in q's dtype. With `rope`, q and
    the new tokens' k arrive unrotated and their k / v are not in the pool yet: the kernel rotates
    them and stores k / v (what `rotary.apply_rotary_store_kv` does), saving a launch per layer.
    An FP8 pool needs `scales` (k_scale, v_scale: float32 [Hkv]; kv_store.py)."""
    bsz, hq, d = q.shape
    fp8 = k_buf.dtype == torch.float8_e4m3fn
    hkv = k_buf.shape[1]
    cfg = resolve_config(bsz, config, pool=pool_kind(k_buf.dtype), head_dim=d, kv_heads=hkv)
    group = hq // hkv
    out = torch.empty_like(q) if out is None else out
    if bsz == 0:
        return out
    direct = cfg["direct"] and num_splits == 1
    block_d = triton.next_power_of_2(d)
    mid_o, mid_lse, mid_strides = _partials(out, num_splits, direct)
    r = rope or DecodeRope(seq_lens, q, q, q, q, seq_lens)  # unused without ROPE
    kv_f16 = fp8 and q.dtype != torch.float32 and cfg["fp8_f16"]
    assert scales is not None or not fp8
    k_scale, v_scale = scales if fp8 else (q, q)  # unused unless FP8
    if rope is not None:
        assert q.stride(2) == r.k.stride(2) == r.v.stride(2) == r.cos.stride(1) == 1 and r.cos.dtype == torch.float32
        assert d % 2 == 0 and r.cos.shape[1] == d
    reg_cap = {"maxnreg": cfg["maxnreg"]} if cfg["maxnreg"] else {}
    _decode_stage1[(bsz, hkv, num_splits)](
        q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, mid_o, mid_lse, out,
        r.positions, r.cos, r.sin, r.k, r.v, r.loc, k_scale, v_scale,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        req_to_token.stride(0), *mid_strides, out.stride(0), out.stride(1),
        r.cos.stride(0), r.k.stride(0), r.k.stride(1), r.v.stride(0), r.v.stride(1),
        scale, num_splits, cfg["split_align"] or cfg["block_n"], d,
        GROUP=group, BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_N=cfg["block_n"], BLOCK_D=block_d,
        DIRECT=direct, ROPE=rope is not None, IEEE=q.dtype == torch.float32, P_PARTS=p_parts(q.dtype, settings, kv_f16),
        KV_FP8=fp8, KV_F16=kv_f16, V_REGS=kv_f16 and cfg["fp8_v_regs"], EXP2=fp8 and cfg["fp8_exp2"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **reg_cap, **pdl_launch(q, settings),
    )
    if not direct:
        _decode_stage2[(bsz, hq)](
            mid_o, mid_lse, out, *mid_strides, out.stride(0), out.stride(1), num_splits, d,
            BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_d, num_warps=4, **pdl_launch(q, settings),
        )
    return out
