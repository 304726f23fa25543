"""FP8 (e4m3) quantization: per-row scales for weights and activations, and the FP8 GEMM.

A row r of a matrix is stored as q[r] = round(x[r] / s[r]) in float8_e4m3fn with
s[r] = max|x[r]| / 448 (448: e4m3's largest finite value), so x ~ q * s. Weights get one scale
per output channel (computed once, at load), activations one per token (computed per call:
"dynamic"). A GEMM of two such matrices is (xq @ wq.T) * sx[:, None] * sw[None, :], which
torch._scaled_mm computes on Hopper with row-wise scales. Reference: `reference.fp8_linear_ref`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixflow import env
from radixflow.kernels.pdl import pdl_launch, pdl_wait
from radixflow.kernels.settings import DEFAULT_KERNEL_SETTINGS, KernelSettings
from radixflow.kernels.reference import FP8, FP8_MAX, INV_FP8_MAX, MIN_SCALE, quantize_rows_torch  # noqa: F401 (re-exported)

# Triton picks its CPU interpreter or the compiler when a kernel is decorated (at import), so this is fixed too.
INTERPRETED = tl.constexpr(env.triton_interpret())
INV_448 = tl.constexpr(INV_FP8_MAX)  # the scale multiplies by it, as quantize_rows_torch does (see there)


@triton.jit
def round_to_e4m3(v):
    """v (float32, |v| <= 448) rounded half-to-even onto the e4m3 grid, still as float32, so that the
    cast to e4m3 afterwards is exact. The GPU's own conversion rounds the same way; Triton's CPU
    interpreter does not (3.9: 124.0 became 64.0), and this keeps the two identical. Many instructions
    a value, so `scaled_to_e4m3` uses it only in the interpreter."""
    a = tl.abs(v)
    exponent = tl.maximum(((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)  # below 2^-6: subnormal steps
    step = ((exponent - 3 + 127) << 23).to(tl.float32, bitcast=True)  # 3 mantissa bits: 2^(e - 3)
    r = a / step  # exact: a power of two
    f = tl.floor(r)
    d = r - f
    up = (d > 0.5) | ((d == 0.5) & ((f.to(tl.int32) & 1) == 1))
    return tl.where(v < 0, -1.0, 1.0) * (f + up.to(tl.float32)) * step


@triton.jit
def scaled_to_e4m3(x, scale):
    """x / scale (float32) clamped to e4m3's range, ready for the cast, as torch's
    `(x / scale).clamp(-448, 448).to(float8_e4m3fn)`. The GPU's conversion rounds half to even, as torch
    does; in Triton's CPU interpreter the value is put on the grid first.
    The division is IEEE round-to-nearest (`div_rn`) as torch's: Triton's `/` compiles to an
    approximate division on the GPU, whose quotient can fall on the other side of a half-way point
    between two e4m3 values and so give other bits than the torch-native path."""
    v = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -448.0), 448.0)
    return round_to_e4m3(v) if INTERPRETED else v


@triton.jit
def store_quantized_row(Q, S, row, stride_q, offs, mask, x):
    """One row x (float32; masked-off values 0) quantized per row: e4m3 values into Q's row, the scale into
    S[row]. `_quantize_rows_kernel`'s one-pass rows, and the norm / activation kernels' FP8 outputs."""
    scale = tl.maximum(tl.max(tl.abs(x), axis=0) * INV_448, 1e-12)
    tl.store(Q + row * stride_q + offs, scaled_to_e4m3(x, scale).to(Q.dtype.element_ty), mask=mask)
    tl.store(S + row, scale)


@triton.jit
def _quantize_rows_kernel(X, Q, S, K, stride_x, stride_q, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr,
                          USE_PDL: tl.constexpr):
    pdl_wait(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    if ONE_PASS:  # the whole row in registers: read once
        x = tl.load(X + row * stride_x + offs, mask=offs < K, other=0.0).to(tl.float32)
        store_quantized_row(Q, S, row, stride_q, offs, offs < K, x)
    else:
        amax = tl.zeros([BLOCK], tl.float32)
        for k0 in range(0, K, BLOCK):  # pass 1: the row's largest magnitude
            x = tl.load(X + row * stride_x + k0 + offs, mask=k0 + offs < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        scale = tl.maximum(tl.max(amax, axis=0) * INV_448, 1e-12)
        for k0 in range(0, K, BLOCK):  # pass 2: the row again (from L2), scaled and rounded
            x = tl.load(X + row * stride_x + k0 + offs, mask=k0 + offs < K, other=0.0).to(tl.float32)
            tl.store(Q + row * stride_q + k0 + offs, scaled_to_e4m3(x, scale).to(Q.dtype.element_ty),
                     mask=k0 + offs < K)
        tl.store(S + row, scale)


ONE_PASS_MAX_K = 16384  # rows up to this wide are held in registers (8 warps: 64 values a thread)


# torch._scaled_mm's row-wise kernel (Hopper) runs a batch whose row count is a multiple of this faster than one
# of fewer rows that is not (H100, gate_up: 400 rows took 1.4x as long as 512, 912 rows 1.2x as long as 1,024;
# BENCHMARKS.md, session 32). So the FP8 GEMM's quantized input gets padding rows up to the next multiple
# (`gemm_rows`). Measured on Hopper only; elsewhere the padding may only cost its rows.
GEMM_ROW_TILE = 128


def gemm_rows(m: int) -> int:
    """Rows to allocate for an FP8 GEMM input of m rows: m rounded up to a multiple of GEMM_ROW_TILE above it."""
    return m if m <= GEMM_ROW_TILE else -(-m // GEMM_ROW_TILE) * GEMM_ROW_TILE


def quantize_rows(x: torch.Tensor, settings: KernelSettings = DEFAULT_KERNEL_SETTINGS,
                  alloc_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (per-token) dynamic quantization in one Triton launch; see `quantize_rows_torch`.
    alloc_rows: the outputs' row count, at least x's (rows past x's are left unwritten: `gemm_rows`)."""
    r, k = x.shape
    assert x.stride(1) == 1
    alloc = r if alloc_rows is None else alloc_rows
    assert alloc >= r
    q = torch.empty((alloc, k), dtype=FP8, device=x.device)
    s = torch.empty((alloc,), dtype=torch.float32, device=x.device)
    if r:
        one_pass = k <= ONE_PASS_MAX_K
        block = triton.next_power_of_2(k) if one_pass else 2048
        _quantize_rows_kernel[(r,)](x, q, s, k, x.stride(0), q.stride(0), BLOCK=block, ONE_PASS=one_pass,
                                    num_warps=8 if block > 4096 else 4, **pdl_launch(x, settings))
    return q, s


@dataclass
class Fp8Rows:
    """Activations already quantized per row by the kernel that made them (kernels/norm_act.py): q [R, K]
    e4m3 and scale [R] float32, as `quantize_rows` gives them, and `dtype`, the GEMM output's dtype. The first
    `rows` rows are the activations; any after them are the GEMM's padding, never written (`empty_rows`)."""

    q: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype
    rows: int


def empty_rows(rows: int, k: int, dtype: torch.dtype, device) -> Fp8Rows:
    """Outputs for `rows` quantized rows, with the FP8 GEMM's padding (`gemm_rows`)."""
    alloc = gemm_rows(rows)
    return Fp8Rows(torch.empty((alloc, k), dtype=FP8, device=device),
                   torch.empty((alloc,), dtype=torch.float32, device=device), dtype, rows)


def scaled_mm_ok(n: int, k: int) -> bool:
    """torch._scaled_mm needs both GEMM dimensions of the weight divisible by 16."""
    return n % 16 == 0 and k % 16 == 0


def fp8_gemm(x: torch.Tensor | Fp8Rows, weight: torch.Tensor, bias: torch.Tensor | None, w_scale: torch.Tensor,
             settings: KernelSettings = DEFAULT_KERNEL_SETTINGS) -> torch.Tensor:
    """CUDA: x [M, K] (bf16/fp16) @ dequant(weight [N, K] e4m3, w_scale [N]).T (+ bias) -> [M, N] in x's dtype,
    x quantized per token first (unless it comes quantized: Fp8Rows), the product by torch._scaled_mm with
    row-wise scales, over the rows padded as `gemm_rows` says."""
    if isinstance(x, Fp8Rows):
        xq, xs, dtype, rows = x.q, x.scale, x.dtype, x.rows
    else:
        rows, dtype = x.shape[0], x.dtype
        xq, xs = quantize_rows(x if x.stride(1) == 1 else x.contiguous(), settings, alloc_rows=gemm_rows(rows))
    out = torch._scaled_mm(xq, weight.t(), scale_a=xs.view(-1, 1), scale_b=w_scale.view(1, -1), out_dtype=dtype,
                           use_fast_accum=settings.fp8_fast_accum)
    out = out[:rows]  # a padding row's product is its own output row only: dropped
    return out if bias is None else out + bias


def dequantize(weight: torch.Tensor, w_scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """weight [N, K] e4m3 with per-row scales [N] -> [N, K] in `dtype` (the CPU path, and tests)."""
    return (weight.float() * w_scale.float().view(-1, 1)).to(dtype)
