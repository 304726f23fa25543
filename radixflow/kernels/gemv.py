"""Triton GEMV for a few rows (decode at batch 1..8): out[M, N] = x[M, K] @ weight[N, K].T (+ bias).

Each program owns BLOCK_N outputs and streams their weight rows over all of K with wide
loads, accumulating x * w elementwise in float32 and reducing once at the end, so there is
no split-K partial buffer and no second kernel. For M > 1 the K tile shrinks by M to keep
the accumulator's registers constant. Reference: `reference.gemv_ref`.

The weight tiles stream through shared memory: Triton's software pipeliner turns the K loop's
load into cp.async copies `stages - 1` tiles ahead, so a program keeps several tiles in flight
without holding them in registers. (A double buffer in registers, two tiles in flight, was
slower: it keeps fewer bytes in flight.)
On Hopper the kernel is launched with PDL (kernels/pdl.py) and loads its first tile into
registers before waiting for the kernel that produces x.

Whether it beats cuBLAS depends on the shape and the GPU, so `choose_gemv` times both on
the model's own weights and the layers use the winner (runtime/execution/layers/parallel_linear.py).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from radixflow.kernels.pdl import pdl_launch, pdl_wait
from radixflow.kernels.settings import DEFAULT_KERNEL_SETTINGS, KernelSettings

# Launch parameters the load-time chooser tries per weight shape: among 8 configs timed at M=1 after an
# RMSNorm in a CUDA graph, these won one or more of Llama-3-8B's shapes (block_n 4 / block_k 1024 with
# 3 stages for gate_up, with 4 for qkv, 8 / 1024 with 3 for o_proj and down, and 4 / 512 with 6 a close
# second for down). Which wins moves by a few percent between machines, hence all four. The first is the default.
GEMV_CONFIGS = (
    {"block_n": 4, "block_k": 1024, "num_warps": 4, "stages": 3},
    {"block_n": 4, "block_k": 1024, "num_warps": 4, "stages": 4},
    {"block_n": 8, "block_k": 1024, "num_warps": 4, "stages": 3},
    {"block_n": 4, "block_k": 512, "num_warps": 4, "stages": 6},
)
# FP8 weights (a scale per output row). An FP8 row is half a bf16 row's bytes, so a tile of the same bytes has
# twice the columns and, in `_gemv_kernel`, twice the accumulator registers. "unroll": 2 loads two tiles of
# block_k / 2 columns per loop step into one accumulator of that width, which keeps a stage's bytes with half
# the registers. The unrolled candidates won three of Llama-3-8B's four shapes on the H200, 8 x 1024 with
# 8 warps came close on two of them, and the plain 4 x 1024 won qkv (benchmarks/history/2026-12-02.md).
# "words": the weights read as int32 words of four e4m3 values, turned into float32 by bit moves
# (`_e4m3_byte_as_f32`) instead of Triton's conversion instructions. On Hopper they lost on every shape, so
# conversion is not what limits the FP8 GEMV there; the words configs stay candidates for GPUs where it is.
GEMV_CONFIGS_FP8 = (
    {"block_n": 4, "block_k": 1024, "num_warps": 4, "stages": 4},
    {"block_n": 8, "block_k": 2048, "num_warps": 4, "stages": 3, "unroll": 2},
    {"block_n": 8, "block_k": 1024, "num_warps": 4, "stages": 4, "unroll": 2},
    {"block_n": 8, "block_k": 1024, "num_warps": 8, "stages": 4},
    {"block_n": 4, "block_k": 2048, "num_warps": 4, "stages": 3, "words": True},
    {"block_n": 8, "block_k": 2048, "num_warps": 4, "stages": 3, "words": True},
    {"block_n": 4, "block_k": 4096, "num_warps": 4, "stages": 3, "words": True},
    {"block_n": 4, "block_k": 1024, "num_warps": 4, "stages": 4, "words": True},
)
# Tried on the H200 and no faster than these on any Llama-3-8B shape (benchmarks/history/): 8 / 2048 with
# 8 warps, a K=4096 row's whole weight requested before the PDL wait, and a persistent grid (one program
# per SM slot walking row blocks p, p + G, ... in one flat K loop), in bf16 too; and the K loop on tensor cores
# (x's rows padded to 16, one MMA a weight tile: the fastest on no shape, 0.72x at best on qkv bf16, session 27;
# the kernel is at commit 3f5aa9d).
GEMV_CONFIG = GEMV_CONFIGS[0]
GEMV_MAX_M = 8  # rows; above this a GEMM (cuBLAS) is the right tool


@triton.jit
def _load_x(X, offs_m, offs_k, k0, M, K, stride_xm):
    """Rows of x at columns k0 + offs_k, as float32 [BLOCK_M, BLOCK_K]."""
    mask = (offs_m[:, None] < M) & ((k0 + offs_k) < K)[None, :]
    return tl.load(X + offs_m[:, None] * stride_xm + k0 + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _fma(acc, x, w, BLOCK_M: tl.constexpr):
    """acc += x * w elementwise, summed over K only at the end: [N, K] for one row, else [M, N, K]."""
    if BLOCK_M == 1:
        acc += w.to(tl.float32) * x
    else:
        acc += x[:, None, :] * w.to(tl.float32)[None, :, :]
    return acc


@triton.jit
def summed_rows(acc, BLOCK_M: tl.constexpr):
    """An elementwise accumulator (`_fma`'s) summed over K: [BLOCK_M, BLOCK_N]."""
    if BLOCK_M == 1:
        out = tl.sum(acc, axis=1)[None, :]
    else:
        out = tl.sum(acc, axis=2)
    return out  # one return: Triton refuses a return inside a branch here


@triton.jit
def _store_rows(acc, Out, Bias, Scale, scale_factor, offs_m, offs_n, M, N, stride_om,
                HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, BLOCK_M: tl.constexpr):
    """Out[offs_m, offs_n] = acc summed over K, times the row scale (FP8: Scale[n] * scale_factor), plus bias."""
    mask_n = offs_n < N
    out = summed_rows(acc, BLOCK_M)
    if HAS_SCALE:  # FP8 weights: one scale per output row
        out *= (tl.load(Scale + offs_n, mask=mask_n, other=0.0) * scale_factor)[None, :]
    if HAS_BIAS:
        out += tl.load(Bias + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    tl.store(Out + offs_m[:, None] * stride_om + offs_n[None, :], out.to(Out.dtype.element_ty),
             mask=(offs_m[:, None] < M) & mask_n[None, :])


@triton.jit
def _gemv_acc(X, W, M, N, K, stride_xm, stride_wn, offs_m, offs_n, USE_PDL: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UNROLL: tl.constexpr,
              STAGES: tl.constexpr):
    """The K loop: x * w summed elementwise into a float32 accumulator, [BLOCK_N, BLOCK_K] for one row, else
    [BLOCK_M, BLOCK_N, BLOCK_K] (the caller reduces it over K). Waits for the previous kernel (PDL) after the
    first weight tile. Shared by `_gemv_kernel` and kernels/gemv_epilogue.py."""
    offs_k = tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    w_ptrs = W + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    # The weights depend on no earlier kernel: the first tile is loaded before waiting (PDL). Inside the
    # loop the wait would stop Triton from pipelining it, so the first tile is peeled off.
    w = tl.load(w_ptrs, mask=mask_n[:, None] & (offs_k < K)[None, :], other=0.0)
    if UNROLL == 2:
        w1 = tl.load(w_ptrs + BLOCK_K, mask=mask_n[:, None] & (BLOCK_K + offs_k < K)[None, :], other=0.0)
    pdl_wait(USE_PDL)
    if BLOCK_M == 1:
        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], tl.float32)
    acc = _fma(acc, _load_x(X, offs_m, offs_k, 0, M, K, stride_xm), w, BLOCK_M)
    if UNROLL == 2:
        acc = _fma(acc, _load_x(X, offs_m, offs_k, BLOCK_K, M, K, stride_xm), w1, BLOCK_M)
    for k0 in tl.range(UNROLL * BLOCK_K, K, UNROLL * BLOCK_K, num_stages=STAGES):  # cp.async, STAGES - 1 steps ahead
        for u in tl.static_range(UNROLL):
            ku = k0 + u * BLOCK_K
            w = tl.load(w_ptrs + ku, mask=mask_n[:, None] & (ku + offs_k < K)[None, :], other=0.0)
            acc = _fma(acc, _load_x(X, offs_m, offs_k, ku, M, K, stride_xm), w, BLOCK_M)
    return acc


@triton.jit
def _gemv_kernel(
    X, W, Bias, Scale, Out,
    M, N, K, stride_xm, stride_wn, stride_om,
    HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, USE_PDL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UNROLL: tl.constexpr, STAGES: tl.constexpr,
):
    """Each loop step loads UNROLL (1 or 2) tiles of BLOCK_K columns into one [BLOCK_N, BLOCK_K] accumulator,
    so a stage holds UNROLL times the bytes for the accumulator's registers (an FP8 row is half the bytes)."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    acc = _gemv_acc(X, W, M, N, K, stride_xm, stride_wn, offs_m, offs_n, USE_PDL, BLOCK_M, BLOCK_N, BLOCK_K, UNROLL, STAGES)
    _store_rows(acc, Out, Bias, Scale, 1.0, offs_m, offs_n, M, N, stride_om, HAS_BIAS, HAS_SCALE, BLOCK_M)


@triton.jit
def _e4m3_byte_as_f32(words, J: tl.constexpr):
    """Byte J of each int32 word, an e4m3 value, as float32 times 2^-120, by bit moves alone: its exponent and
    mantissa bits go to the low end of float32's exponent and the top of its mantissa, its sign to the sign.
    e4m3's subnormals land on float32 subnormals, so every value is exact."""
    if J == 3:
        mag = (words >> 4) & 0x07F00000
    else:
        mag = (words << (20 - 8 * J)) & 0x07F00000
    sign = (words << (24 - 8 * J)) & -2147483648
    return (mag | sign).to(tl.float32, bitcast=True)


@triton.jit
def _gemv_fp8_words_kernel(
    X, W, Scale, Bias, Out,
    M, N, K, stride_xm, stride_wn, stride_om,
    HAS_BIAS: tl.constexpr, USE_PDL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, STAGES: tl.constexpr,
):
    """`_gemv_kernel` for FP8 weights read as int32 words (W, stride_wn in words; K % 4 == 0): word w of a
    row holds columns 4w..4w+3, so the tile's x is read as four strided slices."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_w = tl.arange(0, BLOCK_W)
    mask_n = offs_n < N
    kw = K // 4
    w_ptrs = W + offs_n[:, None].to(tl.int64) * stride_wn + offs_w[None, :]
    words = tl.load(w_ptrs, mask=mask_n[:, None] & (offs_w < kw)[None, :], other=0)
    pdl_wait(USE_PDL)
    if BLOCK_M == 1:
        acc = tl.zeros([BLOCK_N, BLOCK_W], tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_W], tl.float32)
    for j in tl.static_range(4):
        acc = _fma(acc, _load_x(X, offs_m, 4 * offs_w + j, 0, M, K, stride_xm), _e4m3_byte_as_f32(words, j), BLOCK_M)
    for w0 in tl.range(BLOCK_W, kw, BLOCK_W, num_stages=STAGES):
        words = tl.load(w_ptrs + w0, mask=mask_n[:, None] & (w0 + offs_w < kw)[None, :], other=0)
        for j in tl.static_range(4):
            acc = _fma(acc, _load_x(X, offs_m, 4 * offs_w + j, 4 * w0, M, K, stride_xm), _e4m3_byte_as_f32(words, j),
                       BLOCK_M)
    _store_rows(acc, Out, Bias, Scale, 1.329227995784916e36, offs_m, offs_n, M, N, stride_om,  # 2^120
                HAS_BIAS, True, BLOCK_M)


def gemv_block_k(cfg: dict, block_m: int) -> int:
    """`_gemv_kernel`'s BLOCK_K for a config at BLOCK_M rows: block_k split over the unrolled tiles and
    shrunk by the rows (the accumulator's registers stay constant), at least 16 columns."""
    return max(16, cfg["block_k"] // cfg.get("unroll", 1) // block_m)


def gemv_block_w(cfg: dict, block_m: int) -> int:
    """`_gemv_fp8_words_kernel`'s BLOCK_W (int32 words of four columns) for a config at BLOCK_M rows."""
    return max(16, cfg["block_k"] // 4 // block_m)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, config: dict | None = None,
         w_scale: torch.Tensor | None = None, settings: KernelSettings = DEFAULT_KERNEL_SETTINGS) -> torch.Tensor:
    """x: [M, K] with 0 < M <= GEMV_MAX_M; weight: [N, K] (nn.Linear layout); bias: [N] -> [M, N] in x's dtype.
    With w_scale ([N] float32) the weight is FP8 e4m3 and row n of it stands for weight[n] * w_scale[n]."""
    cfg = GEMV_CONFIG if config is None else config
    m, k = x.shape
    n = weight.shape[0]
    assert 0 < m <= GEMV_MAX_M and weight.shape[1] == k and weight.stride(1) == 1
    assert weight.dtype == x.dtype if w_scale is None else (weight.element_size() == 1 and w_scale.numel() == n)
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    block_m = triton.next_power_of_2(m)
    if w_scale is not None and cfg.get("words") and k % 4 == 0 and weight.stride(0) % 4 == 0:
        _gemv_fp8_words_kernel[(triton.cdiv(n, cfg["block_n"]),)](
            x, weight.view(torch.int32), w_scale, out if bias is None else bias, out,
            m, n, k, x.stride(0), weight.stride(0) // 4, out.stride(0),
            HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=cfg["block_n"],
            BLOCK_W=gemv_block_w(cfg, block_m), STAGES=cfg["stages"], num_warps=cfg["num_warps"],
            **pdl_launch(x, settings),
        )
        return out
    unroll = cfg.get("unroll", 1)
    assert unroll in (1, 2)
    _gemv_kernel[(triton.cdiv(n, cfg["block_n"]),)](
        x, weight, out if bias is None else bias, out if w_scale is None else w_scale, out,
        m, n, k, x.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, HAS_SCALE=w_scale is not None, BLOCK_M=block_m, BLOCK_N=cfg["block_n"],
        BLOCK_K=gemv_block_k(cfg, block_m), UNROLL=unroll, STAGES=cfg["stages"], num_warps=cfg["num_warps"],
        **pdl_launch(x, settings),
    )
    return out


# -- choosing between cuBLAS and the GEMV ---------------------------------------------------
def capture_graph(fn: Callable[[int], object], calls: int) -> torch.cuda.CUDAGraph:
    """fn(i), i in range(calls), captured in one CUDA graph (after one eager call to compile)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(0)  # compile, settle cuBLAS's workspace on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(calls):
            fn(i)
    return graph


def replay_us(graph: torch.cuda.CUDAGraph, calls: int, reps: int = 20, warmup: int = 3) -> float:
    """Mean GPU time per captured call over `reps` replays."""
    for _ in range(warmup):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * calls)


def best_of_rounds(graphs: dict, calls: int, rounds: int = 3, reps: int = 20) -> dict:
    """{name: us a call} for {name: graph of `calls` calls}: the best of `rounds` interleaved replays of each,
    so a slow spell of the GPU does not decide between two close candidates."""
    best = {name: float("inf") for name in graphs}
    for _ in range(rounds):
        for name, graph in graphs.items():
            best[name] = min(best[name], replay_us(graph, calls, reps))
    return best


def time_graph_us(fn: Callable[[int], object], calls: int, reps: int = 20, warmup: int = 3) -> float:
    """Mean GPU time of fn(i), i in range(calls), captured in one CUDA graph (launch costs as in a
    decode step, which replays a graph)."""
    return replay_us(capture_graph(fn, calls), calls, reps, warmup)


def _fp8_gemv(x, weight, bias, w_scale, config=None, settings=DEFAULT_KERNEL_SETTINGS):
    return gemv(x, weight, bias, config=config, w_scale=w_scale, settings=settings)


@torch.inference_mode()
def choose_gemv(
    layers: Sequence[tuple], ms: Sequence[int] = (1, 2, 4, 8), settings: KernelSettings = DEFAULT_KERNEL_SETTINGS,
    report: dict | None = None, configs: Sequence[dict] | None = None,
) -> tuple[int, dict, dict[int, tuple[float, float]]]:
    """Time F.linear and `gemv` at each M in `ms` over `layers` ((weight, bias) of one shape, taken in
    turn so the L2 cache holds what it holds in a real step). Each matmul follows an RMSNorm, as every
    projection of a decode step follows a small Triton kernel, so the GEMV's early start under PDL
    counts as it does there (launched as `settings` says). At M=1 every config in GEMV_CONFIGS is timed and the fastest kept. Each
    candidate is the best of three interleaved timings. Returns the largest M up to which the GEMV won at every timed M (0: always cuBLAS), its config,
    and {M: (cublas_us, gemv_us)}, both including the RMSNorm.
    FP8 layers are (weight, bias, w_scale): their GEMM is kernels/fp8.py's (torch._scaled_mm) and their GEMV
    candidates GEMV_CONFIGS_FP8. `report`, if given, receives every candidate's time at the first M
    ({"cublas" or str(config): us}, the RMSNorm included). `configs` replaces the candidate list (benchmarks)."""
    from radixflow.kernels.norm_act import rmsnorm

    w0 = layers[0][0]
    fp8 = len(layers[0]) == 3
    if fp8:
        from radixflow.kernels.fp8 import fp8_gemm
    gemm, gemv_fn, all_configs = (fp8_gemm, _fp8_gemv, GEMV_CONFIGS_FP8) if fp8 else (F.linear, gemv, GEMV_CONFIGS)
    all_configs = all_configs if configs is None else tuple(configs)
    gemm_kw = {"settings": settings} if fp8 else {}
    act_dtype = torch.bfloat16 if fp8 else w0.dtype
    calls = max(len(layers), 8)
    norm_w = torch.ones(w0.shape[1], dtype=act_dtype, device=w0.device)

    def fastest(candidates: dict, x: torch.Tensor) -> dict:
        """{name: us} for {name: (mm, kwargs)}: best_of_rounds of each."""
        graphs = {name: capture_graph(lambda i: mm(rmsnorm(x, norm_w, 1e-6, settings=settings), *layers[i % len(layers)], **kw), calls)
                  for name, (mm, kw) in candidates.items()}
        return best_of_rounds(graphs, calls)

    timings, max_m, winning, config = {}, 0, True, all_configs[0]
    for m in ms:
        x = torch.randn(m, w0.shape[1], dtype=act_dtype, device=w0.device)
        candidates = all_configs if m == ms[0] else (config,)
        us = fastest({"cublas": (gemm, gemm_kw), **{i: (gemv_fn, {"config": c, "settings": settings}) for i, c in enumerate(candidates)}}, x)
        if report is not None and m == ms[0]:
            report.update({name if name == "cublas" else str(candidates[name]): t for name, t in us.items()})
        blas = us.pop("cublas")
        best = min(us, key=us.get)
        if m == ms[0]:
            config = candidates[best]
        timings[m] = (blas, us[best])
        winning = winning and us[best] < blas
        max_m = m if winning else max_m
    return max_m, config, timings
