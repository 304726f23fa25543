"""Triton decode attention over the paged KV pool, read through req_to_token.

One query token per request. Stage 1: a program per (request, block of KV heads, split)
runs online softmax over its split of the sequence for the GQA groups of those KV heads at
once (one K/V read serves a group) and writes a partial output with its log-sum-exp.
Stage 2 merges the splits. The number of splits and every other launch parameter depend
on the batch size and head counts only, never on sequence lengths, so the launch can be
captured in a CUDA graph; how a sequence is cut into its splits is computed in-kernel.

Launch variants (keys of DECODE_CONFIG; benchmarks/gpu_attn_bench.py sweeps them):
- `direct`: with one split, stage 1 writes the normalised output itself and stage 2 is skipped.
- `kv_per_prog`: KV heads per program. tl.dot needs 16 rows, so one group of 4 query heads
  wastes 12; with several KV heads per program their groups fill those rows (scores of a
  head against another head's keys are masked out) and each token's K/V row is read as
  one contiguous kv_per_prog * D chunk.
- `fma`: scores and P @ V as elementwise products and sums instead of tl.dot, with the
  group's rows unpadded (one KV head per program).
- `split_align`: splits are cut at multiples of this many tokens (default block_n), so a
  short sequence spreads over more splits than whole blocks would give it.
- `fused_merge`: no stage 2; the last program of a (request, KV block) to finish, known by
  an atomic counter, merges the splits (one launch less at small batch).
- `heads_fastest`: programs of one request's KV heads are launched next to each other, so
  each token's K/V row (all heads, contiguous) is read at about the same time.
- `maxnreg`: a register cap for stage 1 (None: the compiler's choice). At 8 warps, 64 registers
  let 4 programs share an SM; ptxas gives this kernel ~80 (3 programs) unless capped. A cap
  fits one block shape only, so an explicit `config` does not inherit DECODE_CONFIG's.
- `small`: overrides for batch <= small["max_batch"] (the batch-1 graph).

Both kernels are launched with PDL (kernels/pdl.py); every input is written by earlier
kernels, so each program waits before its first load. Reference: `reference.decode_attention_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixflow.kernels.attention_common import dot, load_kv_block, online_softmax_step
from radixflow.kernels.pdl import pdl_launch, pdl_wait

# Launch parameters, from benchmarks/gpu_attn_bench.py on an H200 (2026-11-30, Llama-3-8B heads, KV
# slots scattered; us per layer call in a CUDA graph, against the previous launch in the same run):
# - large batches: 4 warps, no stage 2 with one split: 440 us (3.92 TB/s) vs 476 at 544 requests x
#   U[32,1536] tokens, 156 vs 165 at 200 x 700, 39.5 vs 42.4 at 64 x 400;
# - batch 1 (`small`): up to 32 splits cut at 16-token multiples, so short sequences use all of them:
#   5.9 / 6.4 / 11.1 us at 256 / 384 / 4096 tokens vs 6.9 / 7.0 / 14.3.
# The other keys are explained in the module doc.
DECODE_CONFIG = {
    "block_n": 64, "num_warps": 4, "num_stages": 3, "waves": 4, "max_splits": 16, "split_align": 0,
    "kv_per_prog": 1, "fma": False, "direct": True, "fused_merge": False, "heads_fastest": False, "maxnreg": None,
    "small": {"max_batch": 1, "max_splits": 32, "split_align": 16},
}
_COUNTERS: dict[torch.device, torch.Tensor] = {}  # fused_merge's arrival counters, zero between calls


@triton.jit
def _load_kv_heads(Slots, tok, kvh, mask_n, K, V, stride_kt, stride_kh, stride_vt, stride_vh, offs_d, mask_d):
    """Like load_kv_block for columns that are (token, KV head) pairs: K as [D, C], V as [C, D]."""
    slot = tl.load(Slots + tok, mask=mask_n, other=0).to(tl.int64)
    k_off = slot * stride_kt + kvh * stride_kh
    v_off = slot * stride_vt + kvh * stride_vh
    k = tl.load(K + k_off[None, :] + offs_d[:, None], mask=mask_n[None, :] & mask_d[:, None], other=0.0)
    v = tl.load(V + v_off[:, None] + offs_d[None, :], mask=mask_n[:, None] & mask_d[None, :], other=0.0)
    return k, v


@triton.jit
def _attend_dot(q, Slots, K, V, start, end, kvh0, offs_h, scale,
                stride_kt, stride_kh, stride_vt, stride_vh, offs_d, mask_d,
                GROUP: tl.constexpr, KVB: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                IEEE: tl.constexpr):
    """Online softmax of q's rows over tokens [start, end) with tl.dot; column c of a block is
    token c // KVB of KV head kvh0 + c % KVB, and row r only sees its own head's columns."""
    m_i = tl.full([q.shape[0]], float("-inf"), tl.float32)
    l_i = tl.zeros([q.shape[0]], tl.float32)
    acc = tl.zeros([q.shape[0], BLOCK_D], tl.float32)
    offs_c = tl.arange(0, BLOCK_N * KVB)
    col_head = offs_c % KVB
    own = ((offs_h // GROUP) % KVB)[:, None] == col_head[None, :]  # padding rows borrow a head: finite
    for n0 in range(start, end, BLOCK_N):
        tok = n0 + offs_c // KVB
        mask_n = tok < end
        if KVB == 1:
            k, v = load_kv_block(Slots, tok, mask_n, K + kvh0 * stride_kh, V + kvh0 * stride_vh, stride_kt, stride_vt,
                                 offs_d, mask_d)
        else:
            k, v = _load_kv_heads(Slots, tok, kvh0 + col_head, mask_n, K, V, stride_kt, stride_kh, stride_vt,
                                  stride_vh, offs_d, mask_d)
        qk = dot(q, k.to(q.dtype), IEEE) * scale
        valid = mask_n[None, :]
        if KVB > 1:
            valid = valid & own
        m_i, l_i, acc = online_softmax_step(tl.where(valid, qk, float("-inf")), v, m_i, l_i, acc, IEEE)
    return m_i, l_i, acc


@triton.jit
def _attend_fma(q, Slots, K, V, start, end, scale, stride_kt, stride_vt, offs_d, mask_d,
                BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """_attend_dot for one KV head with products and sums in float32: no rows padded to 16."""
    m_i = tl.full([q.shape[0]], float("-inf"), tl.float32)
    l_i = tl.zeros([q.shape[0]], tl.float32)
    acc = tl.zeros([q.shape[0], BLOCK_D], tl.float32)
    qf = q.to(tl.float32)[:, :, None]
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        k, v = load_kv_block(Slots, offs_n, mask_n, K, V, stride_kt, stride_vt, offs_d, mask_d)
        qk = tl.sum(qf * k.to(tl.float32)[None, :, :], axis=1) * scale
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _merge_splits(MidO, MidLse, b, heads, mask_h, num_splits, stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
                  offs_d, mask_d, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """The rows `heads` of request b merged over the splits' partial outputs, weighted by
    exp(lse), in float32; BLOCK_S splits at a time. Empty splits (lse -inf, output 0) are read
    too: loading the outputs without waiting for the lse saves a dependent round trip."""
    m = tl.full([heads.shape[0]], float("-inf"), tl.float32)
    l = tl.zeros([heads.shape[0]], tl.float32)
    acc = tl.zeros([heads.shape[0], BLOCK_D], tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        mask = mask_h[:, None] & (offs_s < num_splits)[None, :]
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
    return acc / tl.where(l > 0, l, 1.0)[:, None]


@triton.jit
def _decode_stage1(
    Q, K, V, ReqToToken, ReqIdx, SeqLens, MidO, MidLse, Out, Counters,
    stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_r2t,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
    scale, num_splits, split_align, D,
    GROUP: tl.constexpr, KVB: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    FMA: tl.constexpr, DIRECT: tl.constexpr, FUSED: tl.constexpr, HEADS_FASTEST: tl.constexpr,
    MERGE_H: tl.constexpr, MERGE_S: tl.constexpr, IEEE: tl.constexpr, USE_PDL: tl.constexpr,
):
    if HEADS_FASTEST:
        blk, b, num_blk = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.num_programs(0)
    else:
        b, blk, num_blk = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.num_programs(1)
    split = tl.program_id(2)
    pdl_wait(USE_PDL)
    seq_len = tl.load(SeqLens + b).to(tl.int32)
    row = tl.load(ReqIdx + b).to(tl.int64)
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), split_align) * split_align
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    heads = blk * KVB * GROUP + offs_h
    mask_h = offs_h < KVB * GROUP
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_h[:, None] & mask_d[None, :], other=0.0)
    Slots = ReqToToken + row * stride_r2t
    if FMA:
        m_i, l_i, acc = _attend_fma(q, Slots, K + blk * stride_kh, V + blk * stride_vh, start, end, scale,
                                    stride_kt, stride_vt, offs_d, mask_d, BLOCK_N, BLOCK_D)
    else:
        m_i, l_i, acc = _attend_dot(q, Slots, K, V, start, end, blk * KVB, offs_h, scale, stride_kt, stride_kh,
                                    stride_vt, stride_vh, offs_d, mask_d, GROUP, KVB, BLOCK_N, BLOCK_D, IEEE)

    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    mask_o = mask_h[:, None] & mask_d[None, :]
    if DIRECT:
        tl.store(Out + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(Out.dtype.element_ty), mask=mask_o)
    else:
        lse = tl.where(nonempty, m_i + tl.log(tl.where(nonempty, l_i, 1.0)), float("-inf"))
        tl.store(MidO + b * stride_mb + heads[:, None] * stride_mh + split * stride_ms + offs_d[None, :],
                 out, mask=mask_o)
        tl.store(MidLse + b * stride_lb + heads * stride_lh + split, lse, mask=mask_h)
        if FUSED:
            _merge_if_last(MidO, MidLse, Out, Counters + b * num_blk + blk, b,
                           blk * KVB * GROUP, KVB * GROUP, num_splits, stride_mb, stride_mh, stride_ms, stride_lb,
                           stride_lh, stride_ob, stride_oh, offs_d, mask_d, MERGE_H, MERGE_S, BLOCK_D)


@triton.jit
def _merge_if_last(MidO, MidLse, Out, Counter, b, head0, nheads, num_splits,
                   stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
                   offs_d, mask_d, MERGE_H: tl.constexpr, MERGE_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """fused_merge: count this program's arrival; the last of the splits merges them all and
    resets the counter. The barrier puts every thread's partial stores before the (release)
    increment; the merge reads through L2 (.cg) after the (acquire) increment."""
    tl.debug_barrier()
    if tl.atomic_add(Counter, 1, sem="acq_rel") == num_splits - 1:
        tl.atomic_xchg(Counter, 0, sem="relaxed")
        offs_h = tl.arange(0, MERGE_H)
        mask_h = offs_h < nheads
        heads = head0 + offs_h
        out = _merge_splits(MidO, MidLse, b, heads, mask_h, num_splits, stride_mb, stride_mh, stride_ms,
                            stride_lb, stride_lh, offs_d, mask_d, MERGE_S, BLOCK_D)
        tl.store(Out + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :], out.to(Out.dtype.element_ty),
                 mask=mask_h[:, None] & mask_d[None, :])


@triton.jit
def _decode_stage2(
    MidO, MidLse, Out,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
    num_splits, D,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) + tl.arange(0, 1)
    pdl_wait(USE_PDL)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    out = _merge_splits(MidO, MidLse, b, heads, heads >= 0, num_splits, stride_mb, stride_mh, stride_ms,
                        stride_lb, stride_lh, offs_d, mask_d, BLOCK_S, BLOCK_D)
    tl.store(Out + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=mask_d[None, :])


def resolve_config(batch: int, config: dict | None = None) -> dict:
    """The launch parameters for this batch size: DECODE_CONFIG, or `config` over its keys
    (without DECODE_CONFIG's `small` and `maxnreg` unless `config` brings its own), then `small`
    if it applies."""
    cfg = dict(DECODE_CONFIG) if config is None else {**DECODE_CONFIG, "small": {}, "maxnreg": None, **config}
    small = cfg.pop("small")
    if batch <= small.get("max_batch", 0):
        cfg.update({k: v for k, v in small.items() if k != "max_batch"})
    return cfg


def _kv_per_prog(cfg: dict, kv_heads: int) -> int:
    """kv_per_prog lowered to a power of two that divides kv_heads (1 with fma)."""
    kvb = 1 if cfg["fma"] else triton.next_power_of_2(cfg["kv_per_prog"])
    while kv_heads % kvb:
        kvb //= 2
    return kvb


def num_kv_splits(batch: int, kv_heads: int, num_sms: int = 132, waves: int | None = None,
                  config: dict | None = None) -> int:
    """Enough (request, KV block, split) programs to cover the SMs `waves` times, a power of two
    capped at max_splits. Depends on the batch size and head count only (CUDA graphs)."""
    cfg = resolve_config(batch, config)
    waves = cfg["waves"] if waves is None else waves
    programs = max(batch * kv_heads // _kv_per_prog(cfg, kv_heads), 1)
    return min(cfg["max_splits"], triton.next_power_of_2(max(-(-waves * num_sms // programs), 1)))


def _counters(device: torch.device, n: int) -> torch.Tensor:
    """fused_merge's counters: allocated zeroed once per device and kept (graphs hold their address)."""
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < n:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("decode_attention: run fused_merge once at this batch size before graph capture")
        buf = _COUNTERS[device] = torch.zeros(max(n, 1 << 14), dtype=torch.int32, device=device)
    return buf


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
) -> torch.Tensor:
    """q: [B, Hq, D]; k_buf/v_buf: [S, Hkv, D]; returns [B, Hq, D] in q's dtype."""
    bsz, hq, d = q.shape
    cfg = resolve_config(bsz, config)
    hkv = k_buf.shape[1]
    group = hq // hkv
    kvb = _kv_per_prog(cfg, hkv)
    out = torch.empty_like(q) if out is None else out
    if bsz == 0:
        return out
    direct = cfg["direct"] and num_splits == 1
    fused = cfg["fused_merge"] and not direct
    rows = triton.next_power_of_2(kvb * group)
    block_d = triton.next_power_of_2(d)
    mid_o, mid_lse, mid_strides = _partials(out, num_splits, direct)
    counters = _counters(q.device, bsz * hkv // kvb) if fused else mid_lse
    blocks = (hkv // kvb, bsz) if cfg["heads_fastest"] else (bsz, hkv // kvb)
    # fused_merge merges up to 8K float32 partial values at a time (registers)
    merge_s = min(triton.next_power_of_2(num_splits), max(1, 8192 // (rows * block_d))) if fused else 1
    _decode_stage1[(*blocks, num_splits)](
        q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, mid_o, mid_lse, out, counters,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        req_to_token.stride(0), *mid_strides, out.stride(0), out.stride(1),
        scale, num_splits, cfg["split_align"] or cfg["block_n"], d,
        GROUP=group, KVB=kvb, BLOCK_H=rows if cfg["fma"] else max(16, rows), BLOCK_N=cfg["block_n"],
        BLOCK_D=block_d, FMA=cfg["fma"], DIRECT=direct, FUSED=fused, HEADS_FASTEST=cfg["heads_fastest"],
        MERGE_H=rows, MERGE_S=merge_s, IEEE=q.dtype == torch.float32,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **pdl_launch(q),
        **({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {}),
    )
    if not (direct or fused):
        _decode_stage2[(bsz, hq)](
            mid_o, mid_lse, out, *mid_strides, out.stride(0), out.stride(1), num_splits, d,
            BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_d, num_warps=4, **pdl_launch(q),
        )
    return out
