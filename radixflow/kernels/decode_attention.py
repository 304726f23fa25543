"""Triton decode attention over the paged KV pool, read through req_to_token.

One query token per request. Stage 1: a program per (request, KV head, split) runs online
softmax over its split of the sequence for the KV head's whole GQA group of query heads at
once (one K/V read serves the group; tl.dot pads the group to 16 rows) and writes a partial
output with its log-sum-exp. Stage 2 merges the splits. The number of splits and every other
launch parameter depend on the batch size and head counts only, never on sequence lengths, so
the launch can be captured in a CUDA graph; how a sequence is cut into its splits is computed
in-kernel.

DECODE_CONFIG (benchmarks/gpu_attn_bench.py, fp8_attn_bench.py and bf16_attn_bench.py sweep it):
block_n / num_warps / num_stages of stage 1; `waves` and `max_splits` for num_kv_splits; `direct`:
with one split, stage 1 writes the normalised output itself and stage 2 is skipped; `split_align`:
splits are cut at multiples of this many tokens (0: block_n), so a short sequence spreads over more splits than
whole blocks would give it; `small`: overrides for batch <= small["max_batch"] (the batch-1
graph); `fp8`: overrides for an FP8 pool from batch fp8["min_batch"] up, where its other gates pass;
`fp8_fallback`: the same where the `fp8` entry's gates fail (the entry it replaced, `FALLBACKS`); `bf16` /
`fp16`: the same for bf16 / fp16 pools (`pool_kind`). A pool entry's gates (POOL_GATES) limit it to what was
timed: min_batch, min_shared_memory (the bytes of shared memory the device allows a block, `entry_fits`),
head_dim, min_kv_heads (the KV heads a rank holds), sm_major (the device's compute capability major);
`fixed_splits`: when set, every batch size uses this many splits; `fp8_f16`: an FP8 pool's K / V are
widened to float16 for the products (False: to q's dtype; kept for A/B); `fp8_v_regs`: with fp8_f16, V
is widened in registers before it goes through shared memory (attention_common.e4m3_to_f16_in_registers;
False: where Triton puts it, kept for A/B); `fp8_exp2`: an FP8 pool's scores in log2 units, exponentiated
by attention_common.exp2_ftz; `maxnreg`: a cap on stage 1's registers a thread (Triton's launch option; 0: none),
so more programs fit an SM. A caller's `config` replaces DECODE_CONFIG's keys it names; its own `small` /
pool entries win over its top-level keys at their batch sizes, DECODE_CONFIG's pool entries do not
(`resolve_config`).

DETERMINISTIC_CONFIG fixes every parameter whatever the batch size, so how a sequence is cut,
and the order its splits merge in, depend on its own length alone: a request's output is the
same bits in any batch (--enable-deterministic-inference).

With `rope` (small decode batches, runtime/execution/attention/triton_backend.py), stage 1 also does what
the rotary + KV-store kernel would: each program rotates its q heads, and the program whose split
holds the new token rotates its k and stores k and v in the pool before reading the split.

Both kernels are launched with PDL (kernels/pdl.py); every input is written by earlier
kernels, so each program waits before its first load. Reference: `reference.decode_attention_ref`
(with `rope`: `reference.rotary_store_kv_ref`, then it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixflow.kernels.attention_common import (
    as_f16_pow2, dot, e4m3_to_f16_in_registers, load_kv_block, online_softmax_step, p_parts, to_kv_dtype,
)
from radixflow.kernels.pdl import pdl_launch, pdl_wait
from radixflow.kernels.settings import DEFAULT_KERNEL_SETTINGS, KernelSettings

# Launch parameters, chosen by benchmarks/gpu_attn_bench.py (Llama-3-8B heads, KV slots scattered,
# each layer call timed in a CUDA graph against the previous parameters):
# - large batches: 4 warps, and no stage 2 when there is one split (the partials never leave registers);
# - batch 1 (`small`): up to 32 splits cut at 16-token multiples, so short sequences use all of them.
# Several KV heads per program, an elementwise (no tl.dot) path, an in-kernel merge by the last
# split, head-major program order and a register cap were each slower in that sweep and were removed.
# - FP8 pools from batch 256 (`fp8`, chosen by benchmarks/fp8_attn_bench.py at the offline pass's shapes):
#   2 warps, 5 stages (the next blocks' gathered K / V stay in flight during the products), scores in log2
#   units. The kernel, not the pool's layout, held the FP8 pool's read rate: a gather-only probe reads it at
#   the bf16 pool's rate. Timed on an H200 with 128-dim heads at batch >= 256, at 8 KV heads and (session 11,
#   `fp8_attn_bench.py --kv-heads 4 / 1`: 1.03-1.16x the fallback) at a TP rank's 4 and 1, hence min_kv_heads 1.
#   Elsewhere from batch 256 (other GPUs, head sizes) an FP8 pool keeps the entry it had before
#   (`fp8_fallback`: 128-token blocks, 4 warps, 5 stages, wherever a block may have ~105 KiB of shared memory;
#   1.00-1.15x the launch above with V widened in registers at 8 KV heads in the same run), and below 256 that
#   launch. The history has it.
# - bf16 pools from batch 256 (`bf16`, chosen by benchmarks/bf16_attn_bench.py at the offline pass's batch
#   sizes and contexts): 2 warps. Timed only on an H200 (sm_90), 128-dim heads, 8 KV heads in groups of 4
#   (Llama-3-8B unsharded: one split per request, no stage 2), attention p in 2 parts, and there Triton 3.6
#   compiles it to 255 registers: at the register cliff. Hence the gates: other head sizes (256 spills at 2
#   warps), other GPUs, and tensor-parallel ranks with fewer than 8 KV heads (more splits and stage 2, a grid
#   not timed with 2 warps) keep the launch above, as do smaller batches (not timed). Warps cost registers,
#   not shared memory: no min_shared_memory. With CUDA graphs a real batch of 241-255 replays the 256 graph,
#   so it runs this entry too. fp16 pools (`fp16`) were not timed: no entry. benchmarks/history/2026-12-02.md
#   has the sweep.
DECODE_CONFIG = {
    "block_n": 64, "num_warps": 4, "num_stages": 3, "waves": 4, "max_splits": 16, "split_align": 0, "direct": True,
    "small": {"max_batch": 1, "max_splits": 32, "split_align": 16}, "fixed_splits": 0, "fp8_f16": True,
    "fp8_v_regs": True, "fp8_exp2": False, "maxnreg": 0,
    "fp8": {"block_n": 64, "num_warps": 2, "num_stages": 5, "fp8_exp2": True,
            "min_batch": 256, "head_dim": 128, "min_kv_heads": 1, "sm_major": 9},
    "fp8_fallback": {"block_n": 128, "num_warps": 4, "num_stages": 5, "min_batch": 256, "min_shared_memory": 110_000},
    "bf16": {"num_warps": 2, "min_batch": 256, "head_dim": 128, "min_kv_heads": 8, "sm_major": 9},
    "fp16": {},
}
DETERMINISTIC_CONFIG = {"small": {}, "fp8": {}, "bf16": {}, "fp16": {}, "fixed_splits": 16, "split_align": 16,
                        "direct": False}


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


POOL_KINDS = {torch.float8_e4m3fn: "fp8", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "float32"}
POOL_ENTRIES = ("fp8", "bf16", "fp16")  # entries named after the pool kind (pool_kind) they launch
FALLBACKS = {"fp8": "fp8_fallback"}  # a pool's entry where its own entry's gates fail
POOL_GATES = ("min_batch", "min_shared_memory", "head_dim", "min_kv_heads", "sm_major")
ENTRY_GATES = {"small": ("max_batch",), **{name: POOL_GATES for name in (*POOL_ENTRIES, *FALLBACKS.values())}}
LAUNCH_KEYS = set(DECODE_CONFIG) - set(ENTRY_GATES)


def pool_kind(dtype: torch.dtype) -> str:
    """The KV pool's kind as DECODE_CONFIG's entries name it: "fp8", "bf16", "fp16" or "float32"."""
    if dtype not in POOL_KINDS:
        raise ValueError(f"decode_attention: no KV pool of {dtype}; pools: {', '.join(map(str, POOL_KINDS))}")
    return POOL_KINDS[dtype]


def _check_keys(config: dict) -> None:
    """ValueError for a key DECODE_CONFIG does not have, at the top level or in its `small` / pool entries."""
    unknown = set(config) - set(DECODE_CONFIG)
    for name, gates in ENTRY_GATES.items():
        unknown |= {f"{name}.{k}" for k in set(config.get(name, ())) - LAUNCH_KEYS - set(gates)}
    if unknown:
        raise ValueError(f"decode_attention: unknown config keys {sorted(unknown)}")


def entry_fits(entry: dict) -> bool:
    """Whether the current CUDA device passes the entry's device gates: a block may have min_shared_memory bytes
    of shared memory, its compute capability major is sm_major (true on the CPU: the interpreter has neither)."""
    if not torch.cuda.is_available():
        return True
    major, optin = _device_limits(torch.cuda.current_device())
    need = entry.get("min_shared_memory", 0)
    fits = not need or (optin >= need if optin is not None else major >= 9)  # sm_90 / sm_100 give 227 KiB
    return fits and entry.get("sm_major", major) == major


@functools.lru_cache(maxsize=None)
def _device_limits(device: int) -> tuple[int, int | None]:
    """(compute capability major, shared memory a block may opt into or None), asked once per device:
    resolve_config runs for every decode launch (every layer of an eager pass)."""
    props = torch.cuda.get_device_properties(device)
    return props.major, getattr(props, "shared_memory_per_block_optin", None)


def _shape_fits(entry: dict, head_dim: int | None, kv_heads: int | None) -> bool:
    """Whether the entry's shape gates pass; an unknown head size or KV head count fails a gate that names it."""
    if "head_dim" in entry and entry["head_dim"] != head_dim:
        return False
    return "min_kv_heads" not in entry or (kv_heads or 0) >= entry["min_kv_heads"]


def _entry(batch: int, small: dict, pool_entries: list[tuple[str, dict]], head_dim: int | None,
           kv_heads: int | None) -> tuple[str | None, dict]:
    """The name and launch overrides (gates left out) of the entry that applies at this batch size: `small`, else the
    first of the pool's (name, entry) whose gates pass; or (None, {})."""
    if batch <= small.get("max_batch", 0):
        return "small", {k: v for k, v in small.items() if k not in ENTRY_GATES["small"]}
    for name, entry in pool_entries:
        if batch >= entry.get("min_batch", 0) and _shape_fits(entry, head_dim, kv_heads) and entry_fits(entry):
            return name, {k: v for k, v in entry.items() if k not in POOL_GATES}
    return None, {}


def resolve_config(batch: int, config: dict | None = None, *, pool: str | None = None, head_dim: int | None = None,
                   kv_heads: int | None = None) -> dict:
    """The launch parameters for this batch size, pool kind (`pool_kind`; None: no pool entry), head size and KV
    head count (None: unknown, so no entry gated on it applies). From the bottom up: DECODE_CONFIG's top-level
    keys, DECODE_CONFIG's entry that applies (`small`, the pool's or its fallback), `config`'s top-level keys,
    `config`'s own entry that applies. A `config` without `small` has none (sweeps give whole launches); one without
    the pool's entry (or its fallback) keeps DECODE_CONFIG's."""
    if pool is not None and pool not in POOL_KINDS.values():
        raise ValueError(f"decode_attention: pool {pool!r} is none of {sorted(POOL_KINDS.values())}")
    config = config or {}
    _check_keys(config)
    small = config.get("small", {} if config else DECODE_CONFIG["small"])
    names = [n for n in (pool, FALLBACKS.get(pool)) if n in ENTRY_GATES]  # the pool's entry, then its fallback
    name, entry = _entry(batch, small, [(n, config.get(n, DECODE_CONFIG[n])) for n in names], head_dim, kv_heads)
    base = {k: v for k, v in DECODE_CONFIG.items() if k in LAUNCH_KEYS}
    own = {k: v for k, v in config.items() if k in LAUNCH_KEYS}
    return {**base, **own, **entry} if name in config else {**base, **entry, **own}


def num_kv_splits(batch: int, kv_heads: int, num_sms: int = 132, waves: int | None = None,
                  config: dict | None = None, *, pool: str | None = None, head_dim: int | None = None) -> int:
    """Enough (request, KV head, split) programs to cover the SMs `waves` times, a power of two capped at
    max_splits. Depends on the batch size, head counts, head size and pool kind only (CUDA graphs); give
    decode_attention's pool and head size, so an entry that changes the split count applies to both alike."""
    cfg = resolve_config(batch, config, pool=pool, head_dim=head_dim, kv_heads=kv_heads)
    if cfg["fixed_splits"]:
        return cfg["fixed_splits"]
    waves = cfg["waves"] if waves is None else waves
    programs = max(batch * kv_heads, 1)
    return min(cfg["max_splits"], triton.next_power_of_2(max(-(-waves * num_sms // programs), 1)))


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
