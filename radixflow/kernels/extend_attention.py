"""Triton extend (prefill) attention over the paged KV pool.

The new tokens' K/V are stored in the pool first; then query i of request b (at
position prefix_len + i) attends to KV positions 0..prefix_len + i of that request,
read through req_to_token: the cached prefix and, causally, its own new tokens.
A program handles BLOCK_M rows of one request for one KV head (flash-attention style online
softmax), a row being a (new token, query head) pair of that KV head's group, token-major: the
group's query heads share each K/V block read. So a request with a few new tokens after a long
cached prefix (a select's choices, a program's next segment) fills a block with its tokens' heads
instead of padding a 128-row block per query head, and reads the prefix once per KV head instead
of once per query head. Each row's scores and softmax run over the same K/V tiles in the same order
as with one head per program. Reference: `reference.extend_attention_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixflow.kernels.attention_common import as_f16_pow2, dot, load_kv_block, online_softmax_step, p_parts
from radixflow.kernels.settings import DEFAULT_KERNEL_SETTINGS, KernelSettings


@triton.jit
def _extend_kernel(
    Q, K, V, Out, ReqToToken, ReqIdx, PrefixLens, ExtendLens, QStart,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, stride_r2t,
    scale, GROUP: tl.constexpr, D, KScale, VScale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
    P_PARTS: tl.constexpr, KV_FP8: tl.constexpr, KV_F16: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    mblk = tl.program_id(2)
    ext = tl.load(ExtendLens + b).to(tl.int32)
    if mblk * BLOCK_M < ext * GROUP:
        pre = tl.load(PrefixLens + b).to(tl.int32)
        q0 = tl.load(QStart + b).to(tl.int64)
        row = tl.load(ReqIdx + b).to(tl.int64)
        if KV_FP8:  # the pool holds K / k_scale, V / v_scale (decode_attention.py does the same)
            scale = scale * tl.load(KScale + kvh)
        offs_r = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
        tok = offs_r // GROUP  # the row's new token
        head = kvh * GROUP + offs_r % GROUP  # and its query head
        mask_m = tok < ext
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < D
        q = tl.load(Q + (q0 + tok[:, None]) * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                    mask=mask_m[:, None] & mask_d[None, :], other=0.0)
        if KV_F16:
            q, q_unit = as_f16_pow2(q)
            scale = scale * q_unit
        q_pos = pre + tok
        kv_end = pre + tl.minimum(((mblk + 1) * BLOCK_M + GROUP - 1) // GROUP, ext)

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for n0 in range(0, kv_end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < kv_end
            k, v = load_kv_block(ReqToToken + row * stride_r2t, offs_n, mask_n, K + kvh * stride_kh,
                                 V + kvh * stride_vh, stride_kt, stride_vt, offs_d, mask_d)
            allowed = mask_n[None, :] & (offs_n[None, :] <= q_pos[:, None])
            qk = tl.where(allowed, dot(q, k.to(q.dtype), IEEE) * scale, float("-inf"))
            m_i, l_i, acc = online_softmax_step(qk, v.to(q.dtype), m_i, l_i, acc, IEEE, P_PARTS)
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        if KV_FP8:
            out *= tl.load(VScale + kvh)
        tl.store(Out + (q0 + tok[:, None]) * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
                 out.to(Out.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def _blocks(dtype: torch.dtype, d: int, rows: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for requests of up to `rows` rows (new tokens x the group's query
    heads): 128-row blocks (32 for float32 and wide heads), smaller where no request fills one."""
    most, block_n, warps = (32, 32, 4) if dtype == torch.float32 or d > 128 else (128, 64, 8)
    block_m = min(most, max(16, triton.next_power_of_2(rows)))
    return block_m, block_n, warps if block_m == 128 else 4


def extend_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    q_start: torch.Tensor,
    max_extend: int,
    scale: float,
    out: torch.Tensor | None = None,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    settings: KernelSettings = DEFAULT_KERNEL_SETTINGS,
) -> torch.Tensor:
    """q: [T, Hq, D] request-major; q_start: [B] first row of each request in q. An FP8 pool needs `scales`
    (k_scale, v_scale: float32 [Hkv])."""
    t, hq, d = q.shape
    group = hq // k_buf.shape[1]
    out = torch.empty_like(q) if out is None else out
    bsz = extend_lens.shape[0]
    if t == 0 or bsz == 0:
        return out
    fp8 = k_buf.dtype == torch.float8_e4m3fn
    kv_f16 = fp8 and q.dtype != torch.float32  # products in float16 (attention_common.as_f16_pow2)
    assert scales is not None or not fp8
    k_scale, v_scale = scales if fp8 else (q, q)  # unused unless FP8
    # batch-invariant passes keep one block size: a row's bits must not depend on the pass's other requests
    block_m, block_n, warps = _blocks(q.dtype, d, 1 << 20 if settings.batch_invariant else max_extend * group)
    grid = (bsz, k_buf.shape[1], triton.cdiv(max_extend * group, block_m))
    _extend_kernel[grid](
        q, k_buf, v_buf, out, req_to_token, req_pool_indices, prefix_lens, extend_lens, q_start,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        out.stride(0), out.stride(1), req_to_token.stride(0),
        scale, group, d, k_scale, v_scale,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=triton.next_power_of_2(d),
        IEEE=q.dtype == torch.float32, P_PARTS=p_parts(q.dtype, settings, kv_f16), KV_FP8=fp8, KV_F16=kv_f16,
        num_warps=warps, num_stages=2,
    )
    return out


def warm_up(dtype: torch.dtype, k_buf: torch.Tensor, v_buf: torch.Tensor, num_q_heads: int, req_to_token: torch.Tensor,
            scales: tuple[torch.Tensor, torch.Tensor] | None = None,
            settings: KernelSettings = DEFAULT_KERNEL_SETTINGS) -> list[int]:
    """Launch the kernel once at each block size `_blocks` picks (one request of q `dtype`, no prefix, every
    position read from slot 0), so each variant compiles at start-up: one first met mid-run compiles inside
    that forward pass (0.3-1 s on a bare machine; the program suite's `jit_compiles` caught it). Returns the
    block sizes launched."""
    dev, d = k_buf.device, k_buf.shape[2]
    group = num_q_heads // k_buf.shape[1]
    table = torch.zeros_like(req_to_token[:1])  # same dtype and row stride as the real table
    zero = torch.zeros(1, dtype=torch.int64, device=dev)
    sizes = sorted({_blocks(dtype, d, 1 << i)[0] for i in range(21)})
    for block_m in sizes:
        n = max(1, block_m // group)
        q = torch.zeros(n, num_q_heads, d, dtype=dtype, device=dev)
        extend_attention(q, k_buf, v_buf, table, zero, zero, torch.full((1,), n, dtype=torch.int64, device=dev), zero,
                         n, d**-0.5, scales=scales, settings=settings)
    return sizes
