"""Sections decode_bs1, bs1, sampled_bs1, qwen3: batch-1 decode speed, and graphs captured under other kernel settings."""

from __future__ import annotations

import dataclasses
import random

from gpubench.common import DEV, OPTS, RESULTS, SZ, cuda_time, decode_rate, decode_step_read_bytes, free, make_engine, rand_ids, recaptured_rates, weight_bytes
from gpubench.decode_profile import gemv_only_ms, profile_outside_graph, profile_replay
from gpubench.gemv_configs import gemv_configs_in_use
from gpubench.machine import copy_bandwidth, read_bandwidth


def _pdl_off_rates(eng, prompt: list) -> dict:
    """A batch-1 graph captured without PDL (kernels/pdl.py)."""
    return recaptured_rates(eng, prompt, "pdl_off", pdl=False)


def _rotary_apart_rates(eng, prompt: list) -> dict:
    """A batch-1 graph with rotary + KV store as their own kernel, not inside decode attention."""
    return recaptured_rates(eng, prompt, "rotary_apart", fused_rotary_max_batch=0)


def _pdl_late_rates(eng, prompt: list) -> dict:
    """A batch-1 graph whose kernels trigger the next one after their PDL wait, not before it."""
    return recaptured_rates(eng, prompt, "pdl_late", pdl_early_trigger=False)


def _p_parts_rates(eng, prompt: list) -> dict:
    """A batch-1 graph whose attention multiplies p in the other number of bf16 parts (1 or 2)."""
    other = 3 - eng.runner.settings.attention_p_parts
    return recaptured_rates(eng, prompt, f"p{other}", attention_p_parts=other)


def _residual_bf16_rates(eng, prompt: list) -> dict:
    """A batch-1 graph with the residual stream in bf16 (the model's dtype), not float32."""
    return recaptured_rates(eng, prompt, "residual_bf16", fp32_residual=False)


def _epilogue_ab(eng, prompt: list) -> dict:
    """A folded model (layers/norm_fold.py): its batch-1 graph with the GEMV epilogues (as built) against one
    captured without them (the norm and SiLU-and-mul kernels over the same folded weights), interleaved twice in
    this engine; the best of each and their ratio."""
    out = {}
    for rep in range(2):
        out[f"epilogue_on_tok_s#{rep}"] = decode_rate(eng, prompt, SZ["bs1_out"])
        out[f"epilogue_on_replay_ms#{rep}"] = cuda_time(lambda: eng.runner.graph_runner.graphs[1].replay(), 50) * 1e3
        off = recaptured_rates(eng, prompt, "epilogue_off", gemv_epilogue=False)
        out.update({f"{k}#{rep}": v for k, v in off.items()})
    best = {arm: max(out[f"{key}#{r}"] for r in range(2)) for arm, key in
            (("on", "epilogue_on_tok_s"), ("off", "graph_tok_s_epilogue_off"))}
    ms = {arm: min(out[f"{key}#{r}"] for r in range(2)) for arm, key in
          (("on", "epilogue_on_replay_ms"), ("off", "replay_step_ms_epilogue_off"))}
    out.update({"epilogue_tok_s_ratio": best["on"] / best["off"], "epilogue_replay_ms_on": ms["on"],
                "epilogue_replay_ms_off": ms["off"]})
    return out


def sec_decode_bs1() -> dict:
    eng = OPTS.bench_engine
    runner = eng.runner
    total, read = weight_bytes(runner.model)
    prompt = rand_ids(random.Random(7), 128)
    out = {"weight_GB": total / 1e9, "decode_read_GB": read / 1e9,
           "gemv_configs": gemv_configs_in_use(runner.model)}
    out["graph_tok_s"] = decode_rate(eng, prompt, SZ["bs1_out"])
    eng.scheduler.overlap = False
    out["graph_tok_s_overlap_off"] = decode_rate(eng, prompt, SZ["bs1_out"])
    eng.scheduler.overlap = eng.server_args.overlap_enabled(eng.runner.device)
    g = runner.graph_runner
    if g is not None:
        step = cuda_time(lambda: g.graphs[1].replay(), 50)
        out["replay_step_ms"] = step * 1e3
        out["replay_only_tok_s"] = 1 / step
        out["replay_GBps"] = read / step / 1e9
        out.update(_pdl_off_rates(eng, prompt))
        out.update(_pdl_late_rates(eng, prompt))
        out.update(_rotary_apart_rates(eng, prompt))
        out.update(_residual_bf16_rates(eng, prompt))
        out.update(_p_parts_rates(eng, prompt))
    runner.graph_runner = None
    out["eager_tok_s"] = decode_rate(eng, prompt, 64, reps=1)
    runner.graph_runner = g
    out.update(_bs1_roofline(runner, out["graph_tok_s"]))
    try:
        if g is not None:
            out["top_kernels_us_per_step"] = profile_replay(runner)
    except Exception as e:
        out["profile_error"] = repr(e)
    try:
        if g is not None:
            out["outside_graph"] = profile_outside_graph(eng, prompt)
    except Exception as e:
        out["outside_graph_error"] = repr(e)[:500]
    return out


def _bs1_roofline(runner, tok_s: float) -> dict:
    """Batch-1 decode against the bytes a step must read (weights used, KV of the mean context of
    `decode_rate`'s request: 128 prompt tokens, 256 out) at the highest bandwidth read in this run (measured
    here too, so the figure needs no `ceilings` section before it)."""
    if DEV != "cuda":
        return {}
    out = {}
    try:  # the probes allocate up to 4 GiB beside the live engine: if that fails, the section keeps its decode figure
        out["copy_bw_TBps_now"] = copy_bandwidth() / 1e12
        out["read_bw_TBps_now"] = read_bandwidth()
    except Exception as e:  # noqa: BLE001 - recorded
        out["bandwidth_error"] = repr(e)[:300]
        free()
    bw = max(RESULTS.get("_bw", 0.0), out.get("copy_bw_TBps_now", 0.0) * 1e12,
             max(out.get("read_bw_TBps_now", {}).values(), default=0.0) * 1e12)
    if not bw:
        return out
    mean_context = 128 + SZ["bs1_out"] / 2
    step = decode_step_read_bytes(runner, mean_context)
    total, read = weight_bytes(runner.model)
    out.update({"roofline_bw_TBps": bw / 1e12, "step_read_GB": step / 1e9, "weights_read_GB": read / 1e9,
                "kv_read_GB": (step - read) / 1e9, "all_params_GB": total / 1e9,
                "roofline_tok_s": bw / step, "pct_of_roofline": 100 * tok_s * step / bw,
                "pct_of_old_roofline_all_params": 100 * tok_s * total / bw})
    return out


def sec_bs1() -> dict:
    """Batch-1 decode (128 in, 256 out, CUDA graphs) against the honest roofline and the step's matmuls alone,
    without decode_bs1's A/B settings and profiles; in the bench engine of the section's variant (bs1@fp8: FP8
    weights)."""
    eng = OPTS.bench_engine
    g = eng.runner.graph_runner
    prompt = rand_ids(random.Random(7), 128)
    out = {"tok_s": decode_rate(eng, prompt, SZ["bs1_out"], reps=3),
           "gemv_configs": gemv_configs_in_use(eng.runner.model), "folded": eng.runner.model.folded}
    if g is not None:
        step = cuda_time(lambda: g.graphs[1].replay(), 50)
        out["replay_step_ms"], out["replay_only_tok_s"] = step * 1e3, 1 / step
        try:
            out["top_kernels_us_per_step"] = profile_replay(eng.runner)
        except Exception as e:  # noqa: BLE001 - the profile is extra evidence, not the figure
            out["profile_error"] = repr(e)[:300]
    if eng.runner.model.folded and g is not None:
        out.update(_epilogue_ab(eng, prompt))
    try:  # the step's matmuls alone: how much of the gap to the roofline the other kernels leave
        out["gemv_only_ms"] = gemv_only_ms(eng.runner)
    except Exception as e:  # noqa: BLE001 - recorded; the section keeps its figure
        out["gemv_only_error"] = repr(e)[:300]
    out.update(_bs1_roofline(eng.runner, out["tok_s"]))
    if "replay_only_tok_s" in out and "roofline_tok_s" in out:
        out["replay_pct_of_roofline"] = 100 * out["replay_only_tok_s"] / out["roofline_tok_s"]
    if "gemv_only_ms" in out and "roofline_tok_s" in out:
        out["gemv_only_pct_of_roofline"] = 100 * 1e3 / out["gemv_only_ms"] / out["roofline_tok_s"]
    return out


def sec_sampled_bs1() -> dict:
    """Batch-1 decode with temperature 0.8 and top-p 0.9 (the Triton sampling kernel, then torch's
    sort-based path) against greedy, in one engine: what sampling costs a decode step."""
    eng, out = OPTS.bench_engine, {}
    kernel, torch_path = eng.runner.settings, dataclasses.replace(eng.runner.settings, triton_sampling=False)
    prompt = rand_ids(random.Random(7), 128)
    top_p = dict(temperature=0.8, top_p=0.9)
    for rep in range(2):  # interleaved: a slow spell of the machine hits all three
        out[f"greedy_tok_s#{rep}"] = decode_rate(eng, prompt, SZ["bs1_out"])
        out[f"top_p_kernel_tok_s#{rep}"] = decode_rate(eng, prompt, SZ["bs1_out"], **top_p)
        eng.runner.set_kernel_settings(torch_path)
        try:
            out[f"top_p_torch_tok_s#{rep}"] = decode_rate(eng, prompt, SZ["bs1_out"], **top_p)
        finally:
            eng.runner.set_kernel_settings(kernel)
    return out


def sec_qwen3() -> dict:
    eng = make_engine("qwen3-8b", dtype="bfloat16", max_total_tokens=65536, cuda_graph_max_bs=4)
    try:
        prompt = rand_ids(random.Random(3), 128)
        return {"graph_tok_s": decode_rate(eng, prompt, SZ["bs1_out"] // 2, reps=1), "bytes_GB": weight_bytes(eng.runner.model)[0] / 1e9}
    finally:
        free(eng)
