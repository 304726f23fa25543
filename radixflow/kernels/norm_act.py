"""Triton RMSNorm (optionally fused with the residual add) and SiLU-and-mul.

References: `reference.rmsnorm_ref`, `reference.silu_and_mul_ref`. Both kernels work
on one row per program; sums in float32, results rounded to the input dtype where
torch rounds them, so bf16 outputs match the torch path bit for bit in most rows. The
residual may be float32 while x is bf16: the sum keeps the residual's dtype, the
normalised output takes x's.

With `quantize` (an FP8 GEMM reads the output: KernelSettings.fp8_fused_quantize) each row is
rounded to the output dtype as before, then quantized per row to e4m3 with its scale
(kernels/fp8.py's Fp8Rows) in the same program instead of being stored: the bits that
`fp8.quantize_rows` gives from the stored output, without writing and re-reading it or launching
that kernel (on Llama-3-8B FP8, 3 of the 4 quantizations a layer; benchmarks/history/2026-12-03.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixflow.kernels.fp8 import Fp8Rows, empty_rows, store_quantized_row
from radixflow.kernels.pdl import pdl_launch, pdl_wait
from radixflow.kernels.settings import DEFAULT_KERNEL_SETTINGS, KernelSettings


@triton.jit
def _rmsnorm_kernel(
    X, R, W, Out, ROut, S,
    stride_x, stride_r, stride_o, stride_ro,
    N, eps,
    HAS_RES: tl.constexpr, BLOCK: tl.constexpr, QUANT: tl.constexpr, USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(X + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(R + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(ROut.dtype.element_ty)  # the stream's dtype (float32 in bf16 models)
        tl.store(ROut + row * stride_ro + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / N + eps)
    w = tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
    if QUANT:  # Out is e4m3: the row rounded to the activation dtype (X's) as stored unfused, then quantized
        y = (xf * rstd).to(X.dtype.element_ty).to(tl.float32)
        store_quantized_row(Out, S, row, stride_o, offs, mask, (y * w).to(X.dtype.element_ty).to(tl.float32))
    else:
        y = (xf * rstd).to(Out.dtype.element_ty).to(tl.float32)
        tl.store(Out + row * stride_o + offs, (y * w).to(Out.dtype.element_ty), mask=mask)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
            settings: KernelSettings = DEFAULT_KERNEL_SETTINGS, out_dtype: torch.dtype | None = None,
            quantize: bool = False):
    """Same contract as `reference.rmsnorm_ref`; normalises over the last dim. out_dtype: the normalised
    output's (default x's; the float32 stream normalised into the model's dtype). quantize: the output as
    Fp8Rows of 2-D rows (x's dtype rounded, then quantized per row; out_dtype unused)."""
    shape = x.shape
    n = shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    if quantize:
        assert out_dtype in (None, x.dtype), "quantized rows are rounded to x's dtype first"
        fp8_out = empty_rows(rows, n, x.dtype, x.device)
        out, scales = fp8_out.q, fp8_out.scale
    else:
        out = torch.empty((rows, n), dtype=x.dtype if out_dtype is None else out_dtype, device=x.device)
        scales = out  # unused
    if residual is None:
        r2 = res_out = x2  # unused
    else:
        r2 = residual.reshape(-1, n)
        res_out = torch.empty_like(r2)
    if rows:
        block = triton.next_power_of_2(n)
        _rmsnorm_kernel[(rows,)](
            x2, r2, weight, out, res_out, scales,
            x2.stride(0), r2.stride(0), out.stride(0), res_out.stride(0),
            n, eps,
            HAS_RES=residual is not None, BLOCK=block, QUANT=quantize, num_warps=_warps(block),
            **pdl_launch(x2, settings),
        )
    normed = fp8_out if quantize else out.view(shape)
    if residual is None:
        return normed
    return normed, res_out.view(shape)


@triton.jit
def _silu_mul_kernel(X, Out, S, stride_x, stride_o, N, BLOCK: tl.constexpr, INTERLEAVED: tl.constexpr,
                     QUANT: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_wait(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    if INTERLEAVED:  # gate i, up i side by side (layers/norm_fold.py): one contiguous load of 2 * BLOCK, then
        # split in registers (two stride-2 loads moved half-used 4-byte words, the fold's large-batch cost)
        offs2 = 2 * tl.program_id(1) * BLOCK + tl.arange(0, 2 * BLOCK)
        pairs = tl.load(X + row * stride_x + offs2, mask=offs2 < 2 * N, other=0.0).to(tl.float32)
        g, u = tl.split(tl.reshape(pairs, [BLOCK, 2]))
    else:
        g = tl.load(X + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(X + row * stride_x + N + offs, mask=mask, other=0.0).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(X.dtype.element_ty).to(tl.float32)
    if QUANT:  # one program holds the whole row (BLOCK >= N): Out is e4m3
        store_quantized_row(Out, S, row, stride_o, offs, mask, (s * u).to(X.dtype.element_ty).to(tl.float32))
    else:
        tl.store(Out + row * stride_o + offs, (s * u).to(Out.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, settings: KernelSettings = DEFAULT_KERNEL_SETTINGS,
                 interleaved: bool = False, quantize: bool = False) -> torch.Tensor | Fp8Rows:
    """x: [T, 2I] -> silu(x[:, :I]) * x[:, I:]  ([T, I]); interleaved: silu(x[:, 0::2]) * x[:, 1::2].
    quantize: as Fp8Rows (rounded to x's dtype, then quantized per row), one program a row."""
    assert x.dim() == 2 and x.shape[1] % 2 == 0 and x.stride(1) == 1
    n = x.shape[1] // 2
    if quantize:
        fp8_out = empty_rows(x.shape[0], n, x.dtype, x.device)
        out, scales = fp8_out.q, fp8_out.scale
    else:
        out = scales = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    if x.shape[0]:
        block = triton.next_power_of_2(n) if quantize else min(triton.next_power_of_2(n), 2048)
        grid = (x.shape[0], triton.cdiv(n, block))
        _silu_mul_kernel[grid](x, out, scales, x.stride(0), out.stride(0), n, BLOCK=block, INTERLEAVED=interleaved,
                               QUANT=quantize, num_warps=_warps(block), **pdl_launch(x, settings))
    return fp8_out if quantize else out


def _warps(block: int) -> int:
    return max(1, min(16, block // 256))
