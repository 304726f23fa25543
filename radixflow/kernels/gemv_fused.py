"""The batch-1 GEMV with the decode step's small kernel before it folded into its prologue, so a step has
two fewer kernel boundaries per layer (issue 28): RMSNorm with its residual add before qkv and gate_up,
SiLU-and-mul before down. `KernelSettings.gemv_prologue` (`--enable-gemv-prologue`, off by default) turns
them on; at load `choose_prologue` keeps a layer shape's fusion only where it timed faster than the two
kernels. On the H200 it rarely did: every program re-reads the input row (and for RMSNorm the float32
residual and the norm weight) from L2, as many bytes as its weight tiles (benchmarks/history/2026-12-02.md).

RMSNorm needs the whole row's sum of squares before any normalised value, and a row is 4,096 wide, so
every program reads all of it from L2 anyway: it accumulates the sum of squares beside the dot products
in the one K loop and applies the rstd to the sums at the end. So, unlike the standalone kernel, the
normalised input is not rounded to bf16 before the product (closer to float32, not bit-equal to the
unfused path). Program 0 stores the updated residual. SiLU-and-mul rounds as the standalone kernel does.
References: `reference.rmsnorm_ref` then `reference.gemv_ref`; `reference.silu_and_mul_ref` then it.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from radixflow.kernels.gemv import GEMV_CONFIG, GEMV_CONFIGS_FP8, GEMV_MAX_M, launch_gemv_kernel
from radixflow.kernels.settings import DEFAULT_KERNEL_SETTINGS, KernelSettings

PROLOGUE_RMSNORM, PROLOGUE_SILU_MUL = 1, 2  # `_prologue_x`'s
PROLOGUES = {"rmsnorm": PROLOGUE_RMSNORM, "silu_mul": PROLOGUE_SILU_MUL}  # what a layer's `prologue` names


def _config(config: dict | None, w_scale: torch.Tensor | None) -> dict:
    """The fused kernels are `_gemv_kernel`'s: a words config (FP8 read as int32, never a winner on Hopper)
    gives way to the first FP8 config."""
    cfg = GEMV_CONFIG if config is None else config
    return GEMV_CONFIGS_FP8[0] if cfg.get("words") else cfg


def _check(x: torch.Tensor, weight: torch.Tensor, k: int, w_scale: torch.Tensor | None) -> None:
    assert 0 < x.shape[0] <= GEMV_MAX_M and weight.shape[1] == k and weight.stride(1) == 1 and x.stride(1) == 1
    n = weight.shape[0]
    assert weight.dtype == x.dtype if w_scale is None else (weight.element_size() == 1 and w_scale.numel() == n)


def gemv_rmsnorm(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                 bias: torch.Tensor | None = None, config: dict | None = None, w_scale: torch.Tensor | None = None,
                 settings: KernelSettings = DEFAULT_KERNEL_SETTINGS) -> tuple[torch.Tensor, torch.Tensor]:
    """(gemv(rmsnorm(x + residual) * norm_weight, weight), x + residual) in one kernel; x: [M, K] (the model's
    dtype), residual: [M, K] (the stream's dtype) -> ([M, N] in x's dtype, [M, K] in residual's)."""
    residual = residual.contiguous()
    _check(x, weight, x.shape[1], w_scale)
    assert residual.shape == x.shape and norm_weight.shape == (x.shape[1],)
    out = torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
    residual_out = torch.empty_like(residual)
    launch_gemv_kernel(x, weight, bias, w_scale, out, _config(config, w_scale), settings, PROLOGUE_RMSNORM,
                       residual=residual, norm_weight=norm_weight, residual_out=residual_out, eps=eps)
    return out, residual_out


def gemv_silu_mul(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  config: dict | None = None, w_scale: torch.Tensor | None = None,
                  settings: KernelSettings = DEFAULT_KERNEL_SETTINGS) -> torch.Tensor:
    """gemv(silu(gate_up[:, :I]) * gate_up[:, I:], weight) in one kernel; gate_up: [M, 2I], weight: [N, I]."""
    k = gate_up.shape[1] // 2
    _check(gate_up, weight, k, w_scale)
    assert gate_up.shape[1] == 2 * k
    out = torch.empty((gate_up.shape[0], weight.shape[0]), dtype=gate_up.dtype, device=gate_up.device)
    launch_gemv_kernel(gate_up, weight, bias, w_scale, out, _config(config, w_scale), settings, PROLOGUE_SILU_MUL, k=k)
    return out


@torch.inference_mode()
def choose_prologue(layers: Sequence[tuple], prologue_name: str, config: dict, settings: KernelSettings,
                    report: dict | None = None) -> dict | None:
    """At batch 1, time the standalone kernel then the GEMV at `config` (what runs unfused) against the fused
    kernel at each candidate config, over `layers` ((weight, bias) or (weight, bias, w_scale) of one shape) in
    a CUDA graph with PDL as `settings` say; each the best of three interleaved timings. Returns the fastest
    fused config if it beats the unfused pair, else None. `report` receives {name: us}."""
    prologue = PROLOGUES[prologue_name]
    from radixflow.kernels.gemv import GEMV_CONFIGS, capture_graph, gemv, replay_us
    from radixflow.kernels.norm_act import rmsnorm, silu_and_mul

    w0 = layers[0][0]
    fp8 = len(layers[0]) == 3
    k = w0.shape[1]
    act = torch.bfloat16 if fp8 else w0.dtype
    x = torch.randn(1, 2 * k if prologue == PROLOGUE_SILU_MUL else k, device=w0.device).to(act)
    residual, norm_w = torch.randn(1, k, device=w0.device), torch.ones(k, dtype=act, device=w0.device)
    calls = max(len(layers), 8)

    def layer(i: int) -> tuple:
        w, b, *s = layers[i % len(layers)]
        return w, b, (s[0] if s else None)

    def unfused(i: int) -> None:
        w, b, s = layer(i)
        h = silu_and_mul(x, settings) if prologue == PROLOGUE_SILU_MUL else rmsnorm(x, norm_w, 1e-6, residual, settings)[0]
        gemv(h, w, b, config=config, w_scale=s, settings=settings)

    def fused(cfg: dict) -> Callable[[int], object]:
        if prologue == PROLOGUE_SILU_MUL:
            return lambda i: gemv_silu_mul(x, *layer(i)[:2], config=cfg, w_scale=layer(i)[2], settings=settings)
        return lambda i: gemv_rmsnorm(x, residual, norm_w, 1e-6, *layer(i)[:2], config=cfg, w_scale=layer(i)[2],
                                      settings=settings)

    candidates = [c for c in (GEMV_CONFIGS_FP8 if fp8 else GEMV_CONFIGS) if not c.get("words")]
    graphs = {"unfused": capture_graph(unfused, calls), **{str(c): capture_graph(fused(c), calls) for c in candidates}}
    best = {name: float("inf") for name in graphs}
    for _ in range(3):
        for name, graph in graphs.items():
            best[name] = min(best[name], replay_us(graph, calls))
    if report is not None:
        report.update(best)
    winner = min(candidates, key=lambda c: best[str(c)])
    return winner if best[str(winner)] < best["unfused"] else None
