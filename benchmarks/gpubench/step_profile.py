"""Section step_profile: where a large-batch decode step's GPU time goes, kernel by kernel.

`prof_n` requests of `prof_len` random prompt tokens are prefilled once (one output token each), then
run again for `prof_out` tokens: the second run's prefill is a radix-cache hit, so nearly all of it is
decode at a batch of `prof_n` over contexts of about `prof_len` tokens. torch.profiler records its GPU
kernels; the section reports GPU time per decode step by kernel and in groups (GEMM and GEMV, attention, FP8
activation quantization, norms / activations / rotary / KV store, sampling, the rest). Run it as
step_profile@fp8 and step_profile@bf16 to see what FP8 weights change.

The profiled run has PDL off (kernels/pdl.py; the engine's settings are restored after): with it on, a
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

import torch

from gpubench.common import OPTS, SZ, greedy, rand_ids, sync
from gpubench.offline import ForwardRecorder

GROUPS = (  # the first pattern a kernel's name matches names its group
    ("gemm", r"gemm|gemv|nvjet|cutlass|xmma|scaled_mm|_matmul|splitk"),
    ("attention", r"decode_stage|extend|attention|_fwd"),
    ("fp8_quantize", r"quantize_rows"),
    ("norm_act_rotary_kv", r"rmsnorm|silu|rotary|store_kv|kv_store"),
    ("sampling", r"argmax|sampl|softmax|topk|sort|chunk_stats|_draw|bitmask"),
)


def _group(name: str) -> str:
    return next((g for g, pattern in GROUPS if re.search(pattern, name, re.I)), "other")


def sec_step_profile() -> dict:
    from torch.profiler import ProfilerActivity, profile

    eng = OPTS.bench_engine
    rng = random.Random(11)
    prompts = [rand_ids(rng, SZ["prof_len"]) for _ in range(SZ["prof_n"])]
    eng.flush_cache()
    eng.generate(input_ids=prompts, sampling_params=greedy(1))  # the prompts into the radix cache
    runner = eng.runner
    before = runner.settings
    activity = ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU
    try:
        runner.set_kernel_settings(dataclasses.replace(before, pdl=False))  # non-overlapping kernels
        rec = ForwardRecorder(runner)
        try:
            with profile(activities=[activity]) as prof:
                eng.generate(input_ids=prompts, sampling_params=greedy(SZ["prof_out"]))
                sync()
        finally:
            rec.close()
    finally:
        runner.set_kernel_settings(before)
    steps = rec.summary()
    per_step = max(steps.get("decode_steps", 0), 1)
    attr = "device_time_total" if activity == ProfilerActivity.CUDA else "cpu_time_total"
    kernels = [(e.key, getattr(e, attr, 0) / 1e3, e.count) for e in prof.key_averages()
               if getattr(e, attr, 0) > 0 and not e.key.startswith("cuda")]
    groups: dict = {}
    for name, ms, _ in kernels:
        groups[_group(name)] = groups.get(_group(name), 0.0) + ms / per_step
    total = sum(groups.values())
    top = sorted(kernels, key=lambda k: -k[1])[:25]
    return {"requests": SZ["prof_n"], "prompt_len": SZ["prof_len"], "out_tokens": SZ["prof_out"], "pdl": False, **steps,
            "decode_gpu_ms_per_step": 1e3 * steps.get("decode_gpu_s", 0.0) / per_step,
            "kernel_ms_per_step": total,
            "groups_ms_per_step": {g: round(ms, 3) for g, ms in sorted(groups.items(), key=lambda kv: -kv[1])},
            "groups_share": {g: round(ms / total, 3) for g, ms in groups.items()} if total else {},
            "top_kernels_ms_per_step": [(n[:90], round(ms / per_step, 3), round(c / per_step, 1)) for n, ms, c in top]}
