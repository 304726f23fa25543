"""Batch-invariant Triton GEMM: out[M, N] = x[M, K] @ weight[N, K].T (+ bias), for deterministic inference.

cuBLAS picks its kernel by shape, and for a few rows it splits K across programs, so a token's
output depends on how many other tokens share its matmul: a request's logprobs change with what
it is batched with, and decode rows differ from the same tokens scored in a prefill. Here every
output element is summed in one fixed order, whatever M is: one program per output tile walks K
from 0 in BLOCK_K steps (no split-K), with the same tile shape and the same MMA instructions at
every M. Bias is added in float32 and the result rounded once, to x's dtype or `out_dtype`
(the output head keeps float32 logits). Reference: `reference.gemv_ref` (the same contract).

Decode-sized batches use smaller tiles (more programs stream the weights). That keeps the order
only if every tile shape's MMAs round as LARGE's do: every shape tried with BLOCK_M 16 to 64 and
BLOCK_K 64 or 128 gave LARGE's bits (benchmarks/matmul_bi_bench.py), and
`tests/test_kernels.py::test_gpu_matmul_batch_invariant_llama_shapes` checks across each switch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): the fastest over Llama-3-8B's four weight
# shapes in matmul_bi_bench.py, TINY at 1 and 8 rows, SMALL at 64.
TINY = (16, 32, 64, 4, 6)
SMALL = (64, 32, 128, 4, 4)
LARGE = (64, 128, 64, 4, 4)
TINY_M, SMALL_M = 16, 64  # rows: at or below TINY_M, TINY; then up to SMALL_M, SMALL; then LARGE


def tile_config(m: int) -> tuple:
    return TINY if m <= TINY_M else SMALL if m <= SMALL_M else LARGE


@triton.jit
def _matmul_kernel(
    X, W, Bias, Out, M, N, K, stride_xm, stride_wn, stride_om,
    HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    # Programs run in groups of GROUP_M row tiles per column tile, so a weight tile is reused from L2.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_m = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_ptrs = X + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    w_ptrs = W + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]  # [BLOCK_K, BLOCK_N]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        mask_k = (k0 + offs_k) < K
        x = tl.load(x_ptrs + k0, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        w = tl.load(w_ptrs + k0, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(x, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc)
    if HAS_BIAS:
        acc += tl.load(Bias + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    out_ptrs = Out + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(Out.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def matmul_batch_invariant(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
    config: tuple | None = None,
) -> torch.Tensor:
    """x [..., K] @ weight[N, K].T (+ bias) -> [..., N] in out_dtype (default x's); each row's
    result is the same bits whatever the other rows are. `config` overrides tile_config(M) (benchmarks)."""
    assert x.shape[-1] == weight.shape[1] and weight.stride(1) == 1 and x.dtype == weight.dtype
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    m, k = x2.shape
    n = weight.shape[0]
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    if m:
        bm, bn, bk, warps, stages = config or tile_config(m)
        grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
        _matmul_kernel[grid](
            x2, weight, weight if bias is None else bias, out, m, n, k, x2.stride(0), weight.stride(0), out.stride(0),
            HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=warps, num_stages=stages,
        )
    return out.view(*lead, n)
