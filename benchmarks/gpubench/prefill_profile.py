"""Sections prefill_profile and prefill_kernels: where prefill 8 x 2,048 spends its GPU time (issue 28).

prefill_profile (a bench engine; run as prefill_profile@nofold too): `prefill`'s 8 x 2,048 fresh prompts,
best of 3 wall times with the engine's own settings, the extend passes' GPU time (CUDA events around each
forward), then one batch under torch.profiler with PDL off (so kernel times add up, as in step_profile):
GPU ms per 8,192-token chunk by group and by kernel, the GEMMs' TFLOP/s (linears' FLOPs as computed over the
GEMM group's time) and the gap between the kernels' sum and the passes' GPU time.

prefill_kernels (no engine): the non-GEMM kernels of a chunk alone at 8,192 rows (and 544, a decode batch):
SiLU-and-mul over plain gate_up rows, over interleaved rows (the fold's layout) with the current kernel and
with the stride-2 kernel it replaced (copied here), RMSNorm with the float32 residual add, and the four
linears through F.linear; outputs checked against each other (the interleaved kernels against the plain one
on the same values) before timing.
"""

from __future__ import annotations

import dataclasses
import random

import torch

from gpubench.common import DEV, OPTS, RESULTS, SZ, greedy, rand_ids, sync
from gpubench.offline import run_batch
from gpubench.step_profile import _breakdown, _recorded


def _batch(rng: random.Random) -> list:
    return [rand_ids(rng, SZ["prefill_len"]) for _ in range(SZ["prefill_n"])]


def _linear_flops(model, tokens: int) -> float:
    return 2.0 * tokens * sum(p.numel() for _, p in model.layers.named_parameters() if p.dim() == 2)


def sec_prefill_profile() -> dict:
    eng, rng = OPTS.bench_engine, random.Random(13)
    n, length = SZ["prefill_n"], SZ["prefill_len"]
    params = [greedy(1)] * n
    run_batch(eng, _batch(rng), params)  # compiles
    best = min(run_batch(eng, _batch(rng), params)["s"] for _ in range(3))
    out = {"folded": bool(eng.runner.model.folded), "tok_s": n * length / best, "s": best}
    _, steps = _recorded(eng.runner, lambda: run_batch(eng, _batch(rng), params))
    out["pdl_on"] = steps
    runner, before = eng.runner, eng.runner.settings
    try:
        runner.set_kernel_settings(dataclasses.replace(before, pdl=False), graph_max_bs=1)
        run_batch(eng, _batch(rng), params)  # the PDL-off kernels compile here, not under the profiler
        out["tok_s_pdl_off"] = n * length / min(run_batch(eng, _batch(rng), params)["s"] for _ in range(2))
        prompts = _batch(rng)
        kernels, steps = _recorded(runner, lambda: run_batch(eng, prompts, params))
    finally:
        runner.set_kernel_settings(before)
    chunks = n * length / eng.runner.args.chunked_prefill_size
    prof = _breakdown(kernels, chunks, "chunk")
    gemm_ms = prof["groups_ms_per_chunk"].get("gemm", 0.0)
    flops = _linear_flops(eng.runner.model, eng.runner.args.chunked_prefill_size)
    prof["gemm_TFLOPs"] = flops / (gemm_ms / 1e3) / 1e12 if gemm_ms else None
    if RESULTS.get("_mm") and gemm_ms:
        prof["gemm_pct_of_matmul_rate"] = 100 * prof["gemm_TFLOPs"] * 1e12 / RESULTS["_mm"]
    prof["extend_gpu_ms_per_chunk"] = 1e3 * steps.get("extend_gpu_s", 0.0) / chunks
    prof["outside_kernels_ms_per_chunk"] = prof["extend_gpu_ms_per_chunk"] - prof["kernel_ms_per_chunk"]
    out["pdl_off_profile"] = {**steps, **prof}
    return out


def _gpu_us(fn) -> float:
    from cuda_timing import cuda_queued_s

    return 1e6 * cuda_queued_s(fn, reps=10)


def _silu_rows(m: int, inter: int = 14336) -> dict:
    from gpubench.old_silu import old_silu_interleaved
    from radixflow.kernels.norm_act import silu_and_mul
    from radixflow.runtime.execution.layers.norm_fold import interleave_rows

    plain = torch.randn(m, 2 * inter, device=DEV, dtype=torch.bfloat16)
    inter_x = interleave_rows(plain.T, 2).T.contiguous()
    want = silu_and_mul(plain)
    got = {"interleaved": silu_and_mul(inter_x, interleaved=True), "interleaved_old": old_silu_interleaved(inter_x)}
    gb = 3 * m * inter * 2 / 1e9  # read gate and up, write the product
    res = {"equal_to_plain": {k: bool(torch.equal(v, want)) for k, v in got.items()}}
    for name, fn in (("plain", lambda: silu_and_mul(plain)), ("interleaved", lambda: silu_and_mul(inter_x, interleaved=True)),
                     ("interleaved_old", lambda: old_silu_interleaved(inter_x))):
        us = _gpu_us(fn)
        res[name] = {"us": round(us, 1), "TB_s": round(gb * 1e3 / us, 2)}
    return res


def _rmsnorm_rows(m: int, hidden: int = 4096) -> dict:
    from radixflow.kernels.norm_act import rmsnorm

    x = torch.randn(m, hidden, device=DEV, dtype=torch.bfloat16)
    r = torch.randn(m, hidden, device=DEV, dtype=torch.float32)
    w = torch.ones(hidden, device=DEV, dtype=torch.bfloat16)
    gb = m * hidden * (2 + 4 + 4 + 2) / 1e9
    us = _gpu_us(lambda: rmsnorm(x, w, 1e-5, r))
    return {"us": round(us, 1), "TB_s": round(gb * 1e3 / us, 2)}


def _linears(m: int) -> dict:
    shapes = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
    res, total_us, total_flops = {}, 0.0, 0.0
    for name, (n, k) in shapes.items():
        x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=DEV, dtype=torch.bfloat16) * 0.02
        us = _gpu_us(lambda: torch.nn.functional.linear(x, w))
        res[name] = {"us": round(us, 1), "TFLOPs": round(2 * m * n * k / us / 1e6, 1)}
        total_us, total_flops = total_us + us, total_flops + 2 * m * n * k
    res["layer"] = {"us": round(total_us, 1), "TFLOPs": round(total_flops / total_us / 1e6, 1)}
    return res


def sec_prefill_kernels() -> dict:
    if DEV != "cuda":
        return {"skipped": "CUDA only"}
    out = {}
    for m in (8192, 544):
        out[f"silu_and_mul_{m}"] = _silu_rows(m)
    out["rmsnorm_residual_8192"] = _rmsnorm_rows(8192)
    out["linears_8192"] = _linears(8192)
    sync()
    return out
