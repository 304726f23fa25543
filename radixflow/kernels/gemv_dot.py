"""The small-batch GEMV's K loop on tensor cores (kernels/gemv.py's "dot" configs).

`gemv_dot` computes x @ W[offs_n].T for up to 16 rows of x as one MMA per weight tile: x's rows are the columns
of a [BLOCK_K, 16] operand (zero past M), FP8 weights widen to x's dtype exactly, and the accumulator is an MMA
fragment of a few registers a thread, where `_gemv_acc`'s elementwise tile takes 32-96. Reference and tests as
for the GEMV (kernels/reference.py's gemv_ref; tests/test_kernels.py, test_fp8.py, test_gemv_epilogue.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

from radixflow.kernels.pdl import pdl_wait

# The dot configs: the elementwise accumulator is the suspected limit of the FP8 GEMV (benchmarks/history/
# 2026-12-02.md, session 5). Compiled for sm_90 and checked in the interpreter but not yet timed on a GPU (session 26
# had none), so they are not the chooser's candidates (gemv.GEMV_CONFIGS*): gpu_bench's fp8_kernels section times
# them beside those.
GEMV_DOT_CONFIGS = (
    {"block_n": 16, "block_k": 256, "num_warps": 4, "stages": 4, "dot": True},
    {"block_n": 16, "block_k": 512, "num_warps": 4, "stages": 3, "dot": True},
    {"block_n": 32, "block_k": 256, "num_warps": 4, "stages": 4, "dot": True},
    {"block_n": 64, "block_k": 128, "num_warps": 4, "stages": 5, "dot": True},
)
GEMV_DOT_CONFIGS_FP8 = (
    {"block_n": 16, "block_k": 512, "num_warps": 4, "stages": 4, "dot": True},
    {"block_n": 16, "block_k": 1024, "num_warps": 4, "stages": 3, "dot": True},
    {"block_n": 32, "block_k": 512, "num_warps": 4, "stages": 4, "dot": True},
    {"block_n": 64, "block_k": 256, "num_warps": 4, "stages": 4, "dot": True},
    {"block_n": 16, "block_k": 256, "num_warps": 4, "stages": 6, "dot": True},
)


@triton.jit
def _dot_step(acc, X, w, offs_m, offs_k, k0, M, K, stride_xm, BLOCK_M: tl.constexpr):
    """acc [BLOCK_N, 16] += w [BLOCK_N, BLOCK_K] @ x^T, x's rows as the columns of a [BLOCK_K, 16] operand (zero past
    M). One row (BLOCK_M 1) is loaded as a vector and placed in column 0 in registers: a [BLOCK_K, 16] load would be
    pipelined through shared memory, 15 of its 16 columns zeros, at twice the weight tile's bytes. FP8 weights widen
    to x's dtype exactly; float32 x keeps full precision (no TF32)."""
    mask_k = (k0 + offs_k) < K
    if BLOCK_M == 1:
        x = tl.load(X + k0 + offs_k, mask=mask_k, other=0.0)
        xt = tl.where((offs_m == 0)[None, :], x[:, None], tl.zeros_like(x)[:, None])
    else:
        xt = tl.load(X + offs_m[None, :] * stride_xm + (k0 + offs_k)[:, None], mask=(offs_m < M)[None, :] & mask_k[:, None],
                     other=0.0)
    if X.dtype.element_ty == tl.float32:
        acc = tl.dot(w.to(tl.float32), xt, acc, input_precision="ieee")
    else:
        acc = tl.dot(w.to(X.dtype.element_ty), xt, acc)
    return acc


@triton.jit
def gemv_dot(X, W, M, N, K, stride_xm, stride_wn, offs_n, USE_PDL: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """The K loop on tensor cores ("dot" configs): [BLOCK_M, BLOCK_N] = x @ W[offs_n].T, x's rows padded to 16 for
    the product, the accumulator an MMA fragment of a few registers a thread instead of `_gemv_acc`'s elementwise
    tile. BLOCK_M: 1 (one row) or 16."""
    offs_k = tl.arange(0, BLOCK_K)
    offs_m = tl.arange(0, 16)
    mask_n = offs_n < N
    w_ptrs = W + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    w = tl.load(w_ptrs, mask=mask_n[:, None] & (offs_k < K)[None, :], other=0.0)  # before the PDL wait, as there
    pdl_wait(USE_PDL)
    acc = _dot_step(tl.zeros([BLOCK_N, 16], tl.float32), X, w, offs_m, offs_k, 0, M, K, stride_xm, BLOCK_M)
    for k0 in tl.range(BLOCK_K, K, BLOCK_K, num_stages=STAGES):
        w = tl.load(w_ptrs + k0, mask=mask_n[:, None] & (k0 + offs_k < K)[None, :], other=0.0)
        acc = _dot_step(acc, X, w, offs_m, offs_k, k0, M, K, stride_xm, BLOCK_M)
    if BLOCK_M == 1:  # column 0 of acc: the others are zero
        out = tl.sum(acc, axis=1)[None, :]
    else:
        out = tl.trans(acc)
    return out
