"""The batch-1..8 GEMV with the work of RMSNorm and SiLU-and-mul in its epilogue (issue 28).

With each RMSNorm's weight g folded into the columns of the linear that reads its output
(W' = W * g, runtime/execution/layers/norm_fold.py), norm(h) @ W.T equals rstd(h) * (h @ W'.T):
the normalisation is one scalar a row, applied to the GEMV's outputs. So:

- `gemv_residual` (o_proj, down): out = x @ W.T, rounded to x's dtype as the plain GEMV rounds it,
  plus the residual; writes the new residual (the stream's dtype) and its copy in x's dtype (the next
  GEMV's input), and each row's sum of squares into a float32 slot a row, deterministically: each
  program stores its columns' partial sums, and the last program to finish (an atomic ticket) adds the
  partials in program order and stores the sum (`_row_sums`). A float atomic add per program would add
  them in whatever order the programs finish, and the last bit of rstd would vary between runs;
- `gemv_rstd` (qkv, gate_up): out = (x @ W'.T) * rsqrt(slot / K + eps) (+ bias), x being the residual
  stream in x's dtype, not normalised; with `silu`, W's rows are gate and up interleaved (row 2i gate i,
  row 2i + 1 up i) and it writes silu(gate) * up, rounded as kernels/norm_act.py's kernel rounds.

Each program reads one x vector per weight tile, as the plain GEMV does, and a scalar a row: nothing
re-read per tile (session 10's prologue fusion re-read x, the float32 residual and g per tile and lost).
The slot is read, and the residual read and written, after the PDL wait (kernels/pdl.py), so the
producer's last program has stored the sum: the wait covers every earlier kernel. The K loop is kernels/gemv.py's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixflow.kernels.gemv import GEMV_CONFIG, GEMV_CONFIGS_FP8, GEMV_MAX_M, _gemv_acc, gemv_block_k, summed_rows
from radixflow.kernels.pdl import pdl_launch
from radixflow.kernels.settings import DEFAULT_KERNEL_SETTINGS, KernelSettings


@triton.jit
def _row_sums(part, Partials, Ticket, SumOut, M, PROGRAMS: tl.constexpr, BLOCK_P: tl.constexpr,
              BLOCK_M: tl.constexpr):
    """SumOut[m] = the programs' partial sums `part` [BLOCK_M] added in one fixed order, whatever order the
    programs run in: each stores its partial to Partials [PROGRAMS, BLOCK_M]; the one that takes the last
    ticket (acq_rel: it sees every other program's partial) adds them and resets the ticket to 0.
    BLOCK_P: PROGRAMS rounded up to a power of two (one load)."""
    offs_m = tl.arange(0, BLOCK_M)
    tl.store(Partials + tl.program_id(0) * BLOCK_M + offs_m, part)
    tl.debug_barrier()  # every thread's store comes before the ticket's release
    if tl.atomic_add(Ticket, 1, sem="acq_rel") == PROGRAMS - 1:
        offs_p = tl.arange(0, BLOCK_P)
        parts = tl.load(Partials + offs_p[:, None] * BLOCK_M + offs_m[None, :], mask=(offs_p < PROGRAMS)[:, None],
                        other=0.0, cache_modifier=".cg")
        tl.store(SumOut + offs_m, tl.sum(parts, axis=0), mask=offs_m < M)
        tl.atomic_xchg(Ticket, 0, sem="relaxed")  # ready for the next kernel that counts on it


@triton.jit
def _gemv_epilogue_kernel(
    X, W, Bias, Scale, Out, Res, ResOut, SumIn, SumOut, Partials, Ticket,
    M, N, K, stride_xm, stride_wn, stride_om, stride_r, eps,
    PROGRAMS: tl.constexpr, BLOCK_P: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr,
    NORM_IN: tl.constexpr, RESIDUAL: tl.constexpr, SILU: tl.constexpr, USE_PDL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, UNROLL: tl.constexpr, STAGES: tl.constexpr,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    acc = _gemv_acc(X, W, M, N, K, stride_xm, stride_wn, offs_m, offs_n, USE_PDL, BLOCK_M, BLOCK_N, BLOCK_K, UNROLL, STAGES)
    out = summed_rows(acc, BLOCK_M)
    mask_m, mask_n = offs_m < M, offs_n < N
    mask = mask_m[:, None] & mask_n[None, :]
    if HAS_SCALE:  # FP8 weights: one scale per output row
        out *= tl.load(Scale + offs_n, mask=mask_n, other=0.0)[None, :]
    if NORM_IN:  # the folded RMSNorm's 1 / rms of each input row
        out *= tl.rsqrt(tl.load(SumIn + offs_m, mask=mask_m, other=0.0) / K + eps)[:, None]
    if HAS_BIAS:
        out += tl.load(Bias + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    out = out.to(Out.dtype.element_ty).to(tl.float32)  # where the plain GEMV rounds its output
    if RESIDUAL:
        offs = offs_m[:, None] * stride_r + offs_n[None, :]
        h = (out + tl.load(Res + offs, mask=mask, other=0.0).to(tl.float32)).to(ResOut.dtype.element_ty)
        tl.store(ResOut + offs, h, mask=mask)
        tl.store(Out + offs_m[:, None] * stride_om + offs_n[None, :], h.to(Out.dtype.element_ty), mask=mask)
        hf = h.to(tl.float32)
        _row_sums(tl.sum(hf * hf, axis=1), Partials, Ticket, SumOut, M, PROGRAMS, BLOCK_P, BLOCK_M)
    elif SILU:  # rows interleaved: (gate i, up i) are neighbours, so a program holds both
        g, u = tl.split(tl.reshape(out, [BLOCK_M, BLOCK_N // 2, 2]))
        s = (g / (1.0 + tl.exp(-g))).to(Out.dtype.element_ty).to(tl.float32)
        offs_p = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(Out + offs_m[:, None] * stride_om + offs_p[None, :], (s * u).to(Out.dtype.element_ty),
                 mask=mask_m[:, None] & (offs_p < N // 2)[None, :])
    else:
        tl.store(Out + offs_m[:, None] * stride_om + offs_n[None, :], out.to(Out.dtype.element_ty), mask=mask)


def epilogue_config(config: dict | None, fp8: bool) -> dict:
    """The launch config for the epilogue kernel: the layer's GEMV config unless it is a words config (a
    kernel of its own), then the first FP8 config."""
    cfg = GEMV_CONFIG if config is None else config
    return GEMV_CONFIGS_FP8[0] if fp8 and cfg.get("words") else cfg


def _launch(x, weight, out, *, bias=None, w_scale=None, config=None, settings=DEFAULT_KERNEL_SETTINGS,
            res=None, res_out=None, sum_in=None, sum_out=None, ticket=None, eps=0.0, silu=False) -> None:
    m, k = x.shape
    n = weight.shape[0]
    assert 0 < m <= GEMV_MAX_M and weight.shape[1] == k and weight.stride(1) == 1 and x.stride(1) == 1
    assert weight.dtype == x.dtype if w_scale is None else (weight.element_size() == 1 and w_scale.numel() == n)
    cfg = epilogue_config(config, w_scale is not None)
    assert not silu or (n % 2 == 0 and cfg["block_n"] % 2 == 0)
    block_m = triton.next_power_of_2(m)
    programs = triton.cdiv(n, cfg["block_n"])
    dummy = out
    # each program's partial sums of squares (graph memory, no kernel: every program stores its own)
    partials = dummy if sum_out is None else torch.empty(programs * block_m, dtype=torch.float32, device=x.device)
    _gemv_epilogue_kernel[(programs,)](
        x, weight, dummy if bias is None else bias, dummy if w_scale is None else w_scale, out,
        dummy if res is None else res, dummy if res_out is None else res_out,
        dummy if sum_in is None else sum_in, dummy if sum_out is None else sum_out, partials,
        dummy if ticket is None else ticket,
        m, n, k, x.stride(0), weight.stride(0), out.stride(0), 0 if res is None else res.stride(0), eps,
        PROGRAMS=programs, BLOCK_P=triton.next_power_of_2(programs), HAS_BIAS=bias is not None, HAS_SCALE=w_scale is not None, NORM_IN=sum_in is not None,
        RESIDUAL=res is not None, SILU=silu, BLOCK_M=block_m, BLOCK_N=cfg["block_n"],
        BLOCK_K=gemv_block_k(cfg, block_m), UNROLL=cfg.get("unroll", 1), STAGES=cfg["stages"],
        num_warps=cfg["num_warps"], **pdl_launch(x, settings),
    )


def gemv_rstd(x: torch.Tensor, weight: torch.Tensor, sum_in: torch.Tensor, eps: float, *, silu: bool = False,
              bias: torch.Tensor | None = None, w_scale: torch.Tensor | None = None, config: dict | None = None,
              settings: KernelSettings = DEFAULT_KERNEL_SETTINGS) -> torch.Tensor:
    """(x @ weight.T) * rsqrt(sum_in / K + eps) per row (+ bias): x [M, K] un-normalised, sum_in [M] float32 its
    rows' sums of squares (of the residual stream x rounds). With silu: [M, N / 2] silu(gate) * up of the
    interleaved rows, else [M, N]; in x's dtype."""
    assert sum_in.dtype == torch.float32 and sum_in.numel() >= x.shape[0]
    n = weight.shape[0] // 2 if silu else weight.shape[0]
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    _launch(x, weight, out, bias=bias, w_scale=w_scale, config=config, settings=settings, sum_in=sum_in, eps=eps,
            silu=silu)
    return out


def gemv_residual(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, sum_out: torch.Tensor,
                  ticket: torch.Tensor, *,
                  bias: torch.Tensor | None = None, w_scale: torch.Tensor | None = None, config: dict | None = None,
                  settings: KernelSettings = DEFAULT_KERNEL_SETTINGS) -> tuple[torch.Tensor, torch.Tensor]:
    """h = round(x @ weight.T (+ bias)) + residual -> (h in the residual's dtype, h in x's dtype); stores each row's
    sum of squares of h in sum_out [M] (float32; the same bits whatever order the programs run in). ticket: an int32
    counter, 0 on entry (zeroed by the caller, inside the graph) and left at 0."""
    assert sum_out.dtype == torch.float32 and sum_out.numel() >= x.shape[0]
    assert ticket.dtype == torch.int32 and ticket.numel() == 1
    assert residual.shape == (x.shape[0], weight.shape[0]) and residual.is_contiguous()  # ResOut takes its strides
    res_out = torch.empty_like(residual, memory_format=torch.contiguous_format)
    out = torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
    _launch(x, weight, out, bias=bias, w_scale=w_scale, config=config, settings=settings, res=residual,
            res_out=res_out, sum_out=sum_out, ticket=ticket)
    return res_out, out
