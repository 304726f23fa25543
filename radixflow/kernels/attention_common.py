"""Triton helpers shared by the decode and extend attention kernels.

With 16-bit K/V the softmax weights p (float32) must be rounded to 16 bits for the tensor-core
p @ v. Rounded once, p carries an error of up to 2^-9 of itself into every attention output,
and two kernels that tile the softmax differently round different values: at the Llama-3-8B
shape that alone moved logprobs by ~0.05 (benchmarks/bf16_error_sources.py). So p is split into
a 16-bit high part and the 16-bit remainder, and both are multiplied: ~2^-17 relative error for
a second MMA over the same v tile, which costs little next to reading K and V. A third part
(the remainder's remainder, ~2^-26) lies below float32's own rounding and was dropped: it brought
the attention itself closer to float32 but no output of the engine. `KernelSettings.attention_p_parts`
picks 1 or 2 parts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixflow.kernels.fp8 import INTERPRETED, scaled_to_e4m3
from radixflow.kernels.settings import KernelSettings


def p_parts(dtype, settings: KernelSettings, kv_f16: bool = False) -> int:
    """The P_PARTS launch flag for attention computed in `dtype` (float32 p needs no split). An FP8 KV pool's
    V is widened to q's dtype before p @ v, so pass q's dtype for it. With `kv_f16` (an FP8 pool read through
    float16 products, `as_f16_pow2`) p is one float16 part: its rounding, 2^-12 of p, is 8x below one bf16
    part's and far below e4m3's own 2^-4 on every K and V element, and a second part doubles the p @ v work."""
    return settings.attention_p_parts if dtype in (torch.bfloat16, torch.float16) and not kv_f16 else 1


@triton.jit
def dot(a, b, IEEE: tl.constexpr):
    """a @ b; IEEE keeps float32 inputs in full precision (no TF32)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def online_softmax_step(qk, v, m_i, l_i, acc, IEEE: tl.constexpr, P_PARTS: tl.constexpr, EXP2: tl.constexpr = False):
    """Fold one block of scaled, masked scores qk [M, N] and values v [N, D] into the
    running max m_i, denominator l_i and unnormalised output acc. EXP2: qk and m_i are in log2 units
    (the scale times log2(e)), exponentiated by `exp2_ftz`; l_i and acc come out the same."""
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    l_i, acc = _rescaled(m_i, m_new, l_i, acc, EXP2)
    if EXP2:
        p = exp2_ftz(qk - m_new[:, None])
    else:
        p = tl.exp(qk - m_new[:, None])
    l_i += tl.sum(p, axis=1)
    part = p.to(v.dtype)
    acc += dot(part, v, IEEE)
    if P_PARTS > 1:
        acc += dot((p - part.to(tl.float32)).to(v.dtype), v, IEEE)
    return m_new, l_i, acc


@triton.jit
def _rescaled(m_i, m_new, l_i, acc, EXP2: tl.constexpr):
    """l_i and acc moved from the running max m_i to m_new. Kept a function of its own: inlined into
    online_softmax_step, the same PTX less some debug labels assembles to other sm_90 SASS (registers, instruction
    order) for several decode launches than the code timed on the H200 on 2026-12-05."""
    if EXP2:
        alpha = exp2_ftz(m_i - m_new)
    else:
        alpha = tl.exp(m_i - m_new)
    return l_i * alpha, acc * alpha[:, None]


@triton.jit
def exp2_ftz(x):
    """2^x by one ex2.approx.ftz: tl.exp's ex2.approx without ftz adds a range test and two multiplies a value to
    keep subnormal results, which a softmax weight below 2^-126 never needs (it adds nothing to the sum)."""
    if INTERPRETED:
        return tl.exp2(x)
    return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def to_kv_dtype(x, Scale, head, KV_FP8: tl.constexpr, dtype: tl.constexpr):
    """x as stored in the KV pool: itself in the pool's dtype, or for an FP8 pool x / Scale[head] rounded
    onto e4m3 as KVPool.store (torch) rounds it."""
    if KV_FP8:
        return scaled_to_e4m3(x.to(tl.float32), tl.load(Scale + head)).to(dtype)
    return x.to(dtype)


@triton.jit
def as_f16_pow2(q):
    """q (a 16-bit float tile) as float16 times 2^-e, returned with 2^e: e puts max|q| in [2^14, 2^15), so
    nothing overflows float16 and every bf16 value within 2^28 of the max converts exactly.

    An FP8 pool's K and V are widened to float16 for the tensor-core products, not to q's bf16: e4m3 ->
    float16 is one conversion instruction per two values on Hopper (every e4m3 value is a float16 one),
    e4m3 -> bf16 three (through float16, then float16 -> bf16 one value at a time)."""
    amax = tl.max(tl.max(tl.abs(q.to(tl.float32)), axis=1), axis=0)
    e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 141  # floor(log2(amax)) - 14
    e = tl.minimum(tl.maximum(e, -100), 100)  # an all-zero tile: any e will do
    down = ((127 - e) << 23).to(tl.float32, bitcast=True)
    up = ((127 + e) << 23).to(tl.float32, bitcast=True)
    return (q.to(tl.float32) * down).to(tl.float16), up


@triton.jit
def e4m3_to_f16_in_registers(x):
    """x (e4m3) widened to float16 where this call stands, for an FP8 pool's V tile before p @ v.

    A plain `x.to(float16)` of a tile headed for tl.dot is moved by Triton after the tile's shared-memory
    read, into the layout the tensor-core operand needs. For V (p @ v sums over tokens) that layout packs
    consecutive tokens, which lie a row apart in shared memory, and with no 8-bit transposing ldmatrix on
    sm_90 Triton reads them a byte at a time (benchmarks/history/2026-12-02.md counts it). The same conversion as inline PTX, marked impure so it stays put, is done in registers
    after 16-byte shared loads; the float16 tile then reaches the operand through the 16-bit transposing
    ldmatrix, as a bf16 pool's V does (tests/sm90_compile.py checks both). The CPU interpreter casts."""
    if INTERPRETED:
        return x.to(tl.float16)
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
        "=r,=r,r", [x], dtype=tl.float16, is_pure=False, pack=4)


@triton.jit
def load_kv_block(Slots, offs_n, mask_n, K, V, stride_kt, stride_vt, offs_d, mask_d):
    """Gather a block of tokens' K (as [D, N], ready for q @ k) and V ([N, D]) of one KV
    head through its req_to_token row `Slots`; K and V point at that head."""
    slot = tl.load(Slots + offs_n, mask=mask_n, other=0).to(tl.int64)
    k = tl.load(K + slot[None, :] * stride_kt + offs_d[:, None], mask=mask_n[None, :] & mask_d[:, None], other=0.0)
    v = tl.load(V + slot[:, None] * stride_vt + offs_d[None, :], mask=mask_n[:, None] & mask_d[None, :], other=0.0)
    return k, v
