"""Section step_profile: where a large-batch decode step's (and a prefill chunk's) GPU time goes, kernel by kernel.

`prof_n` requests of `prof_len` random prompt tokens are prefilled once (one output token each), then
run again for `prof_out` tokens: the second run's prefill is a radix-cache hit, so nearly all of it is
decode at a batch of `prof_n` over contexts of about `prof_len` tokens. torch.profiler records its GPU
kernels; the section reports GPU time per decode step by kernel and in groups (GEMM and GEMV, attention, FP8
activation quantization, norms / activations / rotary / KV store, sampling, the rest). The first prompts'
prefill (two chunks of chunked_prefill_size tokens) is profiled the same way, per 1,000 prompt tokens
("prefill"). Run it as step_profile@fp8 and step_profile@bf16 to see what FP8 weights change.

Its decode steps replay CUDA graphs where the engine has one for the batch (--graph-max-bs: by default
every batch; with 256, batch 512 runs eagerly). The section runs with PDL off, warm-up included, so
that nothing compiles during a profiled run (kernels/pdl.py; the engine's settings and graphs are
restored after, and meanwhile graphs are captured only up to batch prof_n): with PDL on, a
Triton kernel that follows another (rmsnorm -> activation quantization, silu_mul -> quantization,
attention stage 1 -> stage 2) starts early and its recorded time includes waiting for its predecessor,
so the kernel times would overlap and their sum would overstate the step. Without PDL every kernel
starts after the one before it has finished: the times add up, and each boundary costs the drain
that PDL hides in serving.
"""

from __future__ import annotations

import dataclasses
import random
import re
import statistics
import time

import torch

from gpubench.common import OPTS, SZ, greedy, rand_ids, sync
from gpubench.offline import ForwardRecorder

GROUPS = (  # the first pattern a kernel's name matches names its group (attention first: flash's names hold "cutlass")
    ("attention", r"decode_stage|extend|attention|_fwd|flash"),
    ("gemm", r"gemm|gemv|nvjet|cutlass|xmma|scaled_mm|_matmul|splitk"),
    ("fp8_quantize", r"quantize_rows"),
    ("norm_act_rotary_kv", r"rmsnorm|silu|rotary|store_kv|kv_store"),
    ("sampling", r"argmax|sampl|softmax|topk|sort|chunk_stats|_draw|bitmask"),
)


def _group(name: str) -> str:
    return next((g for g, pattern in GROUPS if re.search(pattern, name, re.I)), "other")


def _kernel_times(run) -> list:
    """(kernel name, ms, calls) of the GPU kernels `run()` launches, under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    activity = ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        run()
        sync()
    attr = "device_time_total" if activity == ProfilerActivity.CUDA else "cpu_time_total"
    return [(e.key, getattr(e, attr, 0) / 1e3, e.count) for e in prof.key_averages()
            if getattr(e, attr, 0) > 0 and not e.key.startswith("cuda")]


def _breakdown(kernels: list, per: float, unit: str) -> dict:
    """GPU time by group and the top kernels, each divided by `per` (steps or tokens)."""
    groups: dict = {}
    for name, ms, _ in kernels:
        groups[_group(name)] = groups.get(_group(name), 0.0) + ms / per
    total = sum(groups.values())
    top = sorted(kernels, key=lambda k: -k[1])[:25]
    return {f"kernel_ms_per_{unit}": total,
            f"groups_ms_per_{unit}": {g: round(ms, 4) for g, ms in sorted(groups.items(), key=lambda kv: -kv[1])},
            "groups_share": {g: round(ms / total, 3) for g, ms in groups.items()} if total else {},
            f"top_kernels_ms_per_{unit}": [(n[:90], round(ms / per, 4), round(c / per, 1)) for n, ms, c in top]}


def _recorded(runner, run) -> tuple[list, dict]:
    """_kernel_times(run) and the ForwardRecorder's summary of the same run."""
    rec = ForwardRecorder(runner)
    try:
        kernels = _kernel_times(run)
    finally:
        rec.close()
    return kernels, rec.summary()


def sec_step_profile() -> dict:
    runner = OPTS.bench_engine.runner
    before = runner.settings
    graph_max_bs = min(SZ["prof_n"], runner.args.graph_max_bs(runner.device))
    try:  # one switch for the whole section: each recaptures the CUDA graphs
        runner.set_kernel_settings(dataclasses.replace(before, pdl=False), graph_max_bs=graph_max_bs)
        return _step_profile(OPTS.bench_engine)
    finally:
        runner.set_kernel_settings(before)


def _step_profile(eng) -> dict:
    rng = random.Random(11)
    prompts = [rand_ids(rng, SZ["prof_len"]) for _ in range(SZ["prof_n"])]
    eng.flush_cache()
    # the first prompts' prefill, profiled: a few full chunks (chunked_prefill_size tokens each)
    first = max(1, min(len(prompts), 2 * eng.runner.args.chunked_prefill_size // SZ["prof_len"]))
    eng.generate(input_ids=[rand_ids(rng, SZ["prof_len"]) for _ in range(first)], sampling_params=greedy(1))  # compiles
    kernels, steps = _recorded(eng.runner, lambda: eng.generate(input_ids=prompts[:first], sampling_params=greedy(1)))
    prefill_tokens = first * SZ["prof_len"]
    prefill = {"prompts": first, "tokens": prefill_tokens, **steps,
               "extend_gpu_ms_per_1k_tokens": 1e6 * steps.get("extend_gpu_s", 0.0) / prefill_tokens,
               **_breakdown(kernels, prefill_tokens / 1000, "1k_tokens")}
    if prompts[first:]:
        eng.generate(input_ids=prompts[first:], sampling_params=greedy(1))  # the rest into the radix cache
    kernels, steps = _recorded(eng.runner, lambda: eng.generate(input_ids=prompts, sampling_params=greedy(SZ["prof_out"])))
    per_step = max(steps.get("decode_steps", 0), 1)
    return {"requests": SZ["prof_n"], "prompt_len": SZ["prof_len"], "out_tokens": SZ["prof_out"], "pdl": False, **steps,
            "decode_gpu_ms_per_step": 1e3 * steps.get("decode_gpu_s", 0.0) / per_step,
            **_breakdown(kernels, per_step, "step"), "prefill": prefill}


def _decode_run(eng, prompts: list) -> dict:
    """One greedy run of `prompts` (already in the radix cache, which is kept: a cache hit leaves one
    token each to prefill) for prof_out tokens: output tokens per second of wall time, and per decode
    step the ForwardRecorder's mean GPU span and the median host interval between steps."""
    rec = ForwardRecorder(eng.runner)
    try:
        t = time.perf_counter()
        res = eng.generate(input_ids=prompts, sampling_params=greedy(SZ["prof_out"]))
        sync()
        dt = time.perf_counter() - t
    finally:
        rec.close()
    steps = rec.summary()
    dec = [r for r in rec.records if r[0] == "decode"]
    intervals = [b[4] - a[4] for a, b in zip(dec, dec[1:])]
    return {"out_tok_s": sum(r["meta_info"]["completion_tokens"] for r in res) / dt, "decode_steps": len(dec),
            "gpu_ms_per_step": 1e3 * steps.get("decode_gpu_s", 0.0) / max(len(dec), 1),
            "wall_ms_per_step": 1e3 * statistics.median(intervals) if intervals else 0.0}


def sec_decode_graphs() -> dict:
    """Decode at a batch of prof_n over ~prof_len-token contexts (as step_profile, no profiler, the engine's
    own PDL setting), replayed from CUDA graphs and launched eagerly, in one engine: graphs for every batch
    (the engine needs cuda_graph_max_bs >= prof_n: gpu_bench.py's default), then eager above 256 (as
    --cuda-graph-max-bs 256 runs), then graphs again. The prompts stay in the radix cache throughout, so
    out_tok_s is decode plus a one-token prefill per request; gpu_ms_per_step is a mean, wall_ms_per_step
    a median."""
    eng = OPTS.bench_engine
    g = eng.runner.graph_runner
    if g is None or g.max_bs < SZ["prof_n"]:
        return {"skipped": f"needs CUDA graphs up to batch {SZ['prof_n']} (--graph-max-bs)"}
    rng = random.Random(11)
    prompts = [rand_ids(rng, SZ["prof_len"]) for _ in range(SZ["prof_n"])]
    eng.flush_cache()
    eng.generate(input_ids=prompts, sampling_params=greedy(1))  # the prompts into the radix cache
    out, full = {}, g.max_bs
    try:
        for label, max_bs in (("graphs", full), ("eager_above_256", min(256, full)), ("graphs_again", full)):
            g.max_bs = max_bs  # can_run: batches above it launch eagerly; the smaller graphs stay
            out[label] = _decode_run(eng, prompts)
    finally:
        g.max_bs = full
    out["eager_over_graphs_gpu_ms"] = out["eager_above_256"]["gpu_ms_per_step"] / out["graphs"]["gpu_ms_per_step"]
    return out


def sec_decode_sweep() -> dict:
    """Decode at each batch of OPTS.sweep_batches over ~prof_len-token contexts: the step's GPU time by
    kernel group (step_profile's run, PDL off) and its mean GPU time with the engine's own settings (PDL as
    served, no profiler), against the bytes the step must read (weights used plus each row's KV) at
    READ_TBS and its FLOPs (prefill_flops of one token a row) at MMA_TFLOPS, whichever bound is higher."""
    from gpubench.common import kv_bytes_per_token, log, prefill_flops, weight_bytes
    from gpubench.decode_gemm import MMA_TFLOPS, READ_TBS

    eng = OPTS.bench_engine
    runner = eng.runner
    out = {"lt_rows": {}}  # per weight shape, the timed Ms up to which cuBLASLt runs (kernels/blas_choice.py)
    for m in runner.model.modules():
        if hasattr(m, "lt_rows") and hasattr(m, "weight"):
            rows = m.lt_rows
            out["lt_rows"]["x".join(map(str, m.weight.shape))] = [b for b, lt in zip(rows.bounds, rows.lt) if lt]
    for n in (int(b) for b in OPTS.sweep_batches.split(",")):
        SZ["prof_n"] = n
        prof = sec_step_profile()
        rng = random.Random(11)  # _step_profile's prompts, now in the radix cache
        served = _decode_run(eng, [rand_ids(rng, SZ["prof_len"]) for _ in range(n)])
        context = SZ["prof_len"] + SZ["prof_out"] / 2
        read = weight_bytes(runner.model)[1] + n * context * kv_bytes_per_token(runner)
        bound_ms = max(read / READ_TBS / 1e9, prefill_flops(runner.model, n, 1) / MMA_TFLOPS / 1e9)
        bound_ms, served_ms = round(bound_ms, 3), round(served["gpu_ms_per_step"], 3)  # the ratio of the figures shown
        out[f"bs{n}"] = {"read_bytes": int(read), "bound_ms": bound_ms, "served_gpu_ms": served_ms,
                         "served_of_bound": round(bound_ms / served_ms, 3),
                         "profiled_gpu_ms": round(prof["decode_gpu_ms_per_step"], 3),
                         "groups_ms": prof["groups_ms_per_step"], "top": prof["top_kernels_ms_per_step"][:12],
                         "served_out_tok_s": round(served["out_tok_s"], 1)}
        log(f"decode_sweep bs{n}: {out[f'bs{n}']}")
    return out
