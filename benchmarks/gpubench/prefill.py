"""Sections prefill, deterministic: prefill against the matmul rate, and deterministic inference's cost."""

from __future__ import annotations

import dataclasses
import random

from gpubench.common import (
    OPTS, RESULTS, SZ, decode_rate, flash_prefill_on, free, greedy, make_engine, prefill_flops, rand_ids,
    set_extend_settings, weight_bytes,
)
from gpubench.offline import run_batch


def _prefill_seconds(eng, rng: random.Random, n: int, length: int) -> float:
    """The fastest of 3 batches of n fresh random prompts of `length` tokens, 1 output token each,
    after one batch that compiles what the shapes need."""
    run_batch(eng, [rand_ids(rng, length) for _ in range(n)], [greedy(1)] * n)
    return min(run_batch(eng, [rand_ids(rng, length) for _ in range(n)], [greedy(1)] * n)["s"] for _ in range(3))


def sec_prefill() -> dict:
    eng = OPTS.bench_engine
    n, length = SZ["prefill_n"], SZ["prefill_len"]
    t = _prefill_seconds(eng, random.Random(13), n, length)
    model = eng.runner.model
    s = model.shape
    flops = prefill_flops(model, n, length)
    old_count = n * length * (2 * weight_bytes(model)[1] // 2 + 4 * s.num_layers * (length // 2) * s.num_heads * s.head_dim)
    out = {"s": t, "tok_s": n * length / t, "tflops": flops / t / 1e12, "tflops_old_count": old_count / t / 1e12}
    rate = RESULTS.get("_mm8") if OPTS.variant_kw.get("quantization") == "fp8" else RESULTS.get("_mm")
    if rate:
        out["pct_of_matmul_rate"] = 100 * out["tflops"] * 1e12 / rate
        out["pct_of_matmul_rate_old_count"] = 100 * out["tflops_old_count"] * 1e12 / rate
    if OPTS.prefill_p_parts_ab:
        out.update(_prefill_settings_ab(eng, n, length, "attention_p_parts",
                                        (("p1", 1), ("p2", 2), ("default_again", eng.runner.settings.attention_p_parts))))
    backend = eng.runner.backend
    out["cudnn_enabled"] = bool(getattr(backend, "cudnn_ok", False) and eng.runner.settings.cudnn_prefill)
    if getattr(OPTS, "prefill_cudnn_ab", False):
        out.update(_extend_ab(eng, n, length, "cudnn_prefill", "cudnn", flops, rate))
    out["cudnn_shapes"] = sorted(backend.cudnn_shapes.seen) if hasattr(backend, "cudnn_shapes") else []
    if OPTS.prefill_flash_ab:
        out["flash_enabled"] = flash_prefill_on(eng)
        out.update(_extend_ab(eng, n, length, "flash_prefill", "flash", flops, rate))
    return out


def _extend_ab(eng, n: int, length: int, field: str, label: str, flops: float, rate: float | None) -> dict:
    """An extend-only setting off, on, off again in the same engine (the decode graphs kept): tok/s, and % of the
    matmul rate where it was measured."""
    ab = _prefill_settings_ab(eng, n, length, field,
                              ((f"{label}_off", False), (f"{label}_on", True), (f"{label}_off_again", False)),
                              apply=set_extend_settings)
    if rate:
        ab.update({f"pct_of_matmul_rate_{k[6:]}": 100 * flops / (n * length / v) / rate for k, v in list(ab.items())})
    return ab


def _prefill_settings_ab(eng, n: int, length: int, field: str, values: tuple, apply=None) -> dict:
    """Prefill tok/s with the kernel setting `field` at each (label, value), then the engine's settings
    back, in the same engine. `apply(runner, settings)` switches them (default: set_kernel_settings,
    which captures the decode graphs again)."""
    runner = eng.runner
    apply = apply or (lambda r, settings: r.set_kernel_settings(settings))
    rng, out, before = random.Random(17), {}, runner.settings
    try:
        for label, value in values:
            apply(runner, dataclasses.replace(before, **{field: value}))
            out[f"tok_s_{label}"] = n * length / _prefill_seconds(eng, rng, n, length)
    finally:
        apply(runner, before)
    return out


def sec_deterministic() -> dict:
    """--enable-deterministic-inference against the default, Llama-3-8B shape, one engine at a time:
    batch-1 decode (128 in, 256 out), a batch of 64 (in 512, out 128) and `prefill`'s 8 x 2,048 prompts;
    plus whether a request's outputs and logprobs are the same bits alone and inside that batch."""
    rng = random.Random(21)
    prompt, batch = rand_ids(rng, 128), [rand_ids(rng, 512) for _ in range(64)]
    out = {}
    for label, det in (("default", False), ("deterministic", True)):
        eng = make_engine("llama3-8b", **dict(OPTS.bench_kw, cuda_graph_max_bs=64, max_running_requests=64,
                                              enable_deterministic_inference=det))
        res = {"bs1_tok_s": decode_rate(eng, prompt, SZ["bs1_out"])}
        run_batch(eng, batch, [greedy(SZ["shared_out"])] * 64)  # warm-up
        res["bs64_out_tok_s"] = 64 * SZ["shared_out"] / run_batch(eng, batch, [greedy(SZ["shared_out"])] * 64)["s"]
        n, length = SZ["prefill_n"], SZ["prefill_len"]
        res["prefill_tok_s"] = n * length / _prefill_seconds(eng, random.Random(13), n, length)
        lp = dict(sampling_params=greedy(32), return_logprob=True)
        eng.flush_cache()
        alone = eng.generate(input_ids=batch[5], **lp)
        eng.flush_cache()
        together = eng.generate(input_ids=batch[:24], **lp)[5]
        res["alone_equals_batched"] = alone["meta_info"]["output_token_logprobs"] == together["meta_info"]["output_token_logprobs"]
        free(eng)
        out[label] = res
    out["bs1_ratio"] = out["deterministic"]["bs1_tok_s"] / out["default"]["bs1_tok_s"]
    out["bs64_ratio"] = out["deterministic"]["bs64_out_tok_s"] / out["default"]["bs64_out_tok_s"]
    out["prefill_ratio"] = out["deterministic"]["prefill_tok_s"] / out["default"]["prefill_tok_s"]
    return out
