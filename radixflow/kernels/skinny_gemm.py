"""Triton GEMM for decode-sized batches (16..256 rows): out[M, N] = x[M, K] @ weight[N, K].T (+ bias).

At these M a decode step is still bound by reading the weights, and the fewer output tiles a shape
has (N = 4096 gives 64 tiles of 64 columns for 132 SMs) the fewer bytes are in flight. So K is split
over SPLIT programs per tile. Each program writes its float32 partial to a workspace and bumps the
tile's counter; the program that arrives last sums the SPLIT partials in a fixed order (so the result
does not depend on which program finished first), adds the bias, writes the output and zeroes the
counter for the next launch (a CUDA graph replays the same counters). One kernel, no memset.
Reference: `reference.gemv_ref` (the same contract).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT, num_warps, num_stages)
DEFAULT_CONFIG = (64, 64, 128, 1, 4, 4)
_COUNTERS: dict = {}  # device -> int32 tile counters, zero between launches
_MAX_TILES = 1 << 14


def _counters(device: torch.device) -> torch.Tensor:
    c = _COUNTERS.get(device)
    if c is None:
        c = _COUNTERS[device] = torch.zeros(_MAX_TILES, dtype=torch.int32, device=device)
    return c


@triton.jit
def _skinny_kernel(
    X, W, Bias, Out, Part, Count, M, N, K, stride_xm, stride_wn, stride_om, K_SPLIT,
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # row tiles vary fastest, so the programs reading one weight tile run together and share it through L2
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_s = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    k_start = pid_s * K_SPLIT
    x_ptrs = X + offs_m[:, None].to(tl.int64) * stride_xm + (k_start + offs_k)[None, :]
    w_ptrs = W + offs_n[None, :].to(tl.int64) * stride_wn + (k_start + offs_k)[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K_SPLIT, BLOCK_K):  # K_SPLIT is a multiple of BLOCK_K (checked by the caller)
        x = tl.load(x_ptrs + k0, mask=mask_m[:, None], other=0.0)
        w = tl.load(w_ptrs + k0, mask=mask_n[None, :], other=0.0)
        acc = tl.dot(x, w, acc)
    out_ptrs = Out + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    out_mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT == 1:
        if HAS_BIAS:
            acc += tl.load(Bias + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptrs, acc.to(Out.dtype.element_ty), mask=out_mask)
    else:
        tile = pid_n * tl.num_programs(0) + pid_m
        tile_ptrs = Part + tile.to(tl.int64) * SPLIT * BLOCK_M * BLOCK_N \
            + tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        tl.store(tile_ptrs + pid_s * BLOCK_M * BLOCK_N, acc)
        tl.debug_barrier()  # every thread's partial is written before the counter says so
        arrived = tl.atomic_add(Count + tile, 1, sem="acq_rel")
        if arrived == SPLIT - 1:
            total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in range(SPLIT):
                total += tl.load(tile_ptrs + s * BLOCK_M * BLOCK_N, cache_modifier=".cg")
            if HAS_BIAS:
                total += tl.load(Bias + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
            tl.store(out_ptrs, total.to(Out.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(Count + tile, 0)


def fits(k: int, config: tuple) -> bool:
    """Whether `config` can run a K of k: every split a whole number of BLOCK_K steps."""
    _, _, bk, split, _, _ = config
    return k % (bk * split) == 0


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                config: tuple = DEFAULT_CONFIG) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T (+ bias) -> [M, N] in x's dtype, K split `config[3]` ways."""
    assert x.dim() == 2 and x.shape[1] == weight.shape[1] and weight.stride(1) == 1 and x.dtype == weight.dtype
    assert fits(x.shape[1], config), (x.shape, config)
    if x.stride(1) != 1:
        x = x.contiguous()
    bm, bn, bk, split, warps, stages = config
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn), split)
    tiles = grid[0] * grid[1]
    assert tiles <= _MAX_TILES, tiles
    part = torch.empty((tiles * split * bm * bn,) if split > 1 else (1,), dtype=torch.float32, device=x.device)
    _skinny_kernel[grid](
        x, weight, weight if bias is None else bias, out, part, _counters(x.device), m, n, k,
        x.stride(0), weight.stride(0), out.stride(0), k // split,
        HAS_BIAS=bias is not None, SPLIT=split, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages,
    )
    return out
