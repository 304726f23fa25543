"""Sections gemm_row_blocks and offline_row_block_ab: prefill linears as one GEMM per block of rows.

cuBLAS ran every Llama-3-8B linear shape 4-8% faster at 1,024 rows than at a prefill chunk's 8,192
(session 8's gemm_shapes). `--linear-row-block N` (KernelSettings.linear_row_block) runs a linear with
more than N rows as one GEMM per N rows; these sections time it alone, then end to end.
"""

from __future__ import annotations

import dataclasses
import math
import time

import torch
import torch.nn.functional as F

from gpubench.common import DEV, OPTS, RESULTS, SZ, free, log, past_deadline, save
from gpubench.gemm_shapes import SHAPES
from gpubench.offline import _offline_pass, offline_requests

L2_BYTES = 50 * 2**20  # the H200's L2: weight copies rotate past it, as in gemm_shapes


def _time_us(fn, calls: int) -> float:
    """us per fn(i) call: in a CUDA graph on CUDA (kernels/gemv.py), a wall clock on the CPU (smoke)."""
    if DEV == "cuda":
        from radixflow.kernels.gemv import time_graph_us

        return time_graph_us(fn, calls)
    t = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - t) / calls * 1e6


def _shape_blocks(n: int, k: int, m: int) -> dict:
    from radixflow.runtime.execution.layers.parallel_linear import row_blocked_linear

    dtype = torch.bfloat16 if DEV == "cuda" else torch.float32
    copies = max(2, math.ceil(2 * L2_BYTES / (2 * n * k))) if DEV == "cuda" else 2
    weights = [torch.randn(n, k, device=DEV, dtype=dtype) * 0.02 for _ in range(copies)]
    x = torch.randn(m, k, device=DEV, dtype=dtype)
    ref = F.linear(x, weights[0])
    row = {"one_gemm_us": round(_time_us(lambda i: F.linear(x, weights[i % copies]), max(copies, 8)), 2)}
    for block in (b for b in SZ["rb_blocks"] if b < m):
        fn = lambda i, b=block: row_blocked_linear(x, weights[i % copies], None, b)  # noqa: E731
        # the same rows and K reduction; cuBLAS may pick another kernel at the smaller M, so not bit-equal
        row[f"rows{block}_max_diff"] = float((fn(0).float() - ref.float()).abs().max())
        row[f"rows{block}_us"] = round(_time_us(fn, max(copies, 8)), 2)
    for key in [k for k in row if k.endswith("_us")]:
        row[key.replace("_us", "_TFLOPs")] = round(2 * m * n * k / row[key] / 1e6, 1)
    del weights, x
    free()
    return row


def sec_gemm_row_blocks() -> dict:
    """Each linear shape at the prefill chunk's rows, one GEMM against one per block of rows; the block whose
    four shapes (one of each a layer) add up to the least time is `best_block` (0: one GEMM)."""
    m = SZ["rb_rows"]
    shapes = SHAPES if DEV == "cuda" else {name: (n // 64, k // 64) for name, (n, k) in SHAPES.items()}
    out: dict = {"rows": m}
    for name, (n, k) in shapes.items():
        out[name] = _shape_blocks(n, k, m)
        log(f"gemm_row_blocks {name} {n}x{k} at {m} rows: {out[name]}")
    totals = {0: sum(out[s]["one_gemm_us"] for s in shapes)}
    for block in (b for b in SZ["rb_blocks"] if b < m):
        totals[block] = sum(out[s][f"rows{block}_us"] for s in shapes)
    out["layer_us"] = {str(b): round(t, 1) for b, t in totals.items()}
    out["best_block"] = min(totals, key=totals.get)
    return out


def _set_row_block(runner, block: int, restore: bool = False) -> None:
    """The layers' linear_row_block, without capturing the CUDA graphs again: valid while no decode graph has
    more rows than the block (their GEMMs are one GEMM either way), or when restoring the block they had."""
    graphs = runner.graph_runner
    assert restore or block == 0 or graphs is None or graphs.max_bs <= block, (block, graphs.max_bs)
    runner.settings = dataclasses.replace(runner.settings, linear_row_block=block)
    runner.model.set_kernel_settings(runner.settings, runner._fused())


def ab_block(runner) -> int:
    """The block offline_row_block_ab times: --row-block, else the fastest block in this run's gemm_row_blocks
    that no decode graph exceeds (so the graphs need no recapture), else SZ's default."""
    if OPTS.row_block:
        return OPTS.row_block
    graphs = runner.graph_runner
    least = graphs.max_bs if graphs is not None else 0
    layer_us = RESULTS.get("gemm_row_blocks", {}).get("layer_us", {})
    allowed = {int(b): us for b, us in layer_us.items() if int(b) >= max(least, 1)}
    return min(allowed, key=allowed.get) if allowed else SZ["rb_default"]


def sec_offline_row_block_ab() -> dict:
    """`offline`'s workloads with one GEMM per linear (`one_gemm`) and with `ab_block()`'s row blocks
    (`rows`), in one engine, paired by seed and alternating which arm runs first (A B, B A, A B, ...), so a
    drift over the run falls on both; each arm first runs --offline-warmup requests cold. Every pass
    records its steps and its GPU gaps. Saved after every pass; the engine's block is restored after."""
    runner = OPTS.bench_engine.runner
    block, before = ab_block(runner), runner.settings.linear_row_block
    arms = {"one_gemm": 0, "rows": block}
    out: dict = {"block": block}
    RESULTS[OPTS.section_key] = out
    seeds = [int(x) for x in OPTS.offline_seeds.split(",")]
    try:
        for label, arm_block in arms.items():
            _set_row_block(runner, arm_block)
            cold = _offline_pass(OPTS.bench_engine, offline_requests(seeds[0])[: OPTS.offline_warmup or None])
            out[f"{label}_cold_out_tok_s"] = cold["out_tok_s"]
        for i, seed in enumerate(seeds):
            order = list(arms.items()) if i % 2 == 0 else list(arms.items())[::-1]
            for label, arm_block in order:
                if past_deadline():
                    out.setdefault("skipped", []).append(f"{label} seed{seed}")
                    continue
                _set_row_block(runner, arm_block)
                out.setdefault(label, {})[f"seed{seed}"] = _offline_pass(OPTS.bench_engine, offline_requests(seed),
                                                                         steps=True)
                save()
                log(f"offline_row_block_ab {label} seed {seed}: {out[label][f'seed{seed}']['out_tok_s']:.0f} out tok/s")
        for seed in seeds:
            pair = [out.get(label, {}).get(f"seed{seed}", {}).get("out_tok_s") for label in arms]
            if all(pair):
                out[f"ratio_seed{seed}"] = pair[1] / pair[0]
    finally:
        _set_row_block(runner, before, restore=True)
    return out
