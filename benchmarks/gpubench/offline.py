"""Sections offline, offline_1k, offline_*_ab, shared, idle: throughput of many requests."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import statistics
import time

from gpubench.common import (
    Event, OPTS, RESULTS, SZ, flash_prefill_on, free, greedy, log, make_engine, past_deadline, rand_ids, save,
    set_extend_settings, sync,
)


def offline_requests(seed: int = 2024) -> list:
    rng = random.Random(seed)
    smoke = getattr(OPTS, "smoke", False)  # unset outside gpu_bench.py (offline_mixed_projection.py): full sizes
    return [(rand_ids(rng, rng.randint(32, SZ["in_max"])), rng.randint(32 if not smoke else 2, SZ["out_max"]))
            for _ in range(SZ["offline"])]


def run_batch(eng, prompts: list, params: list) -> dict:
    eng.flush_cache()
    st = eng.scheduler.stats
    before = (st.prompt_tokens, st.cached_tokens, st.retractions)
    t = time.perf_counter()
    res = eng.generate(input_ids=prompts, sampling_params=params)
    dt = time.perf_counter() - t
    out_tokens = sum(r["meta_info"]["completion_tokens"] for r in res)
    prompt, cached = st.prompt_tokens - before[0], st.cached_tokens - before[1]
    return {"s": dt, "out_tokens": out_tokens, "out_tok_s": out_tokens / dt,
            "total_tok_s": (out_tokens + sum(map(len, prompts))) / dt, "cache_hit": cached / max(prompt, 1),
            "retractions": st.retractions - before[2]}


class ForwardRecorder:
    """Wraps runner.forward: GPU time of every forward pass (events) and host timestamps."""

    def __init__(self, runner):
        self.runner, self.records = runner, []
        self.sizes = []  # (KV tokens after the pass, new tokens) of each record
        orig = runner.forward

        def timed(fb):
            s, e = Event(), Event()
            s.record()
            logits = orig(fb)
            e.record()
            self.records.append((fb.mode.value, fb.batch_size, s, e, time.perf_counter()))
            self.sizes.append((sum(fb.seq_lens_list), fb.num_tokens))
            return logits

        runner.forward = timed

    def close(self) -> None:
        del self.runner.forward
        sync()

    def summary(self) -> dict:
        out = {}
        for mode in ("extend", "decode"):
            recs = [r for r in self.records if r[0] == mode]
            if recs:
                out[f"{mode}_steps"] = len(recs)
                out[f"{mode}_gpu_s"] = sum(s.elapsed_time(e) for _, _, s, e, _ in recs) / 1e3
        dec = [r for r in self.records if r[0] == "decode"]
        if dec:
            out["decode_mean_bs"] = sum(r[1] for r in dec) / len(dec)
        if len(self.records) > 1:
            first, last = self.records[0], self.records[-1]
            out["gpu_window_s"] = first[2].elapsed_time(last[3]) / 1e3
            # GPU time from one pass's end to the next one's start (sampling kernels, and idle): by the next pass's kind
            between = {"extend": 0.0, "decode": 0.0}
            for a, b in zip(self.records, self.records[1:]):
                between[b[0]] += a[3].elapsed_time(b[2]) / 1e3
            out["between_passes_before_extend_s"] = between["extend"]
            out["between_passes_before_decode_s"] = between["decode"]
        return out

    def decode_steps(self) -> list:
        """(batch, KV tokens read, GPU ms) of every decode step."""
        return [(r[1], kv, r[2].elapsed_time(r[3])) for r, (kv, _) in zip(self.records, self.sizes) if r[0] == "decode"]

    def mode_runs(self) -> list:
        """[mode, passes] for each run of consecutive passes of one kind: whether extend passes interleave with decode."""
        runs: list = []
        for r in self.records:
            if runs and runs[-1][0] == r[0]:
                runs[-1][1] += 1
            else:
                runs.append([r[0], 1])
        return runs

    def gaps(self, min_ms: float) -> list:
        """(pass index, kind, batch, GPU ms idle or sampling before it) for every gap over min_ms."""
        out = []
        for i, (a, b) in enumerate(zip(self.records, self.records[1:]), start=1):
            ms = a[3].elapsed_time(b[2])
            if ms > min_ms:
                out.append((i, b[0], b[1], round(ms, 3)))
        return out

    def extend_steps(self) -> list:
        """(new tokens, KV tokens after the pass, GPU ms) of every extend step."""
        return [(n, kv, r[2].elapsed_time(r[3])) for r, (kv, n) in zip(self.records, self.sizes) if r[0] == "extend"]


def _offline_pass(eng, reqs: list, steps: bool = False) -> dict:
    rec = ForwardRecorder(eng.runner)
    try:
        res = run_batch(eng, [p for p, _ in reqs], [greedy(o) for _, o in reqs])
    finally:
        rec.close()
    res.update(rec.summary())
    # small: whether extend passes interleave with decode, and where the GPU waited (seed 2026's 0.3 s in sessions 8-9)
    res["mode_runs"], res["gaps_over_1ms"] = rec.mode_runs(), rec.gaps(1.0)
    if steps:
        # benchmarks/offline_steps.py reads the decode steps under this key
        res["decode_steps_bs_kv_ms"] = [(b, kv, round(ms, 3)) for b, kv, ms in rec.decode_steps()]
        res["extend_steps_tokens_kv_ms"] = [(t, kv, round(ms, 3)) for t, kv, ms in rec.extend_steps()]
    return res


def sec_offline() -> dict:
    """A cold pass, then a warm pass per seed; the warm passes are the figures. The first pass of a
    process compiles Triton kernels for shapes it has not seen (noticeably slower), which a server pays
    once at start-up, not per workload; it is kept as "cold". Seeds after the first that would start
    past --deadline-s are skipped."""
    eng = OPTS.bench_engine
    seeds = [int(x) for x in OPTS.offline_seeds.split(",")]
    cold = _offline_pass(eng, offline_requests(seeds[0])[: OPTS.offline_warmup or None])
    res = {"cold": {k: cold[k] for k in ("s", "out_tokens", "out_tok_s", "extend_gpu_s", "decode_gpu_s") if k in cold}}
    for i, seed in enumerate(seeds):
        if i and past_deadline():
            res[f"seed{seed}"] = {"skipped": "past --deadline-s"}
            continue
        res[f"seed{seed}"] = _offline_pass(eng, offline_requests(seed), steps=i == 0)
    rates = [res[f"seed{seed}"]["out_tok_s"] for seed in seeds if "out_tok_s" in res[f"seed{seed}"]]
    res.update(out_tok_s=statistics.median(rates), out_tok_s_min=min(rates), out_tok_s_max=max(rates),
               admission_rule=getattr(getattr(eng, "server_args", None), "admission_rule", None))
    return res


def sec_offline_1k() -> dict:
    """1,000 requests of 1,000 random prompt tokens and 1,000 output tokens (ignore_eos), one pass after a
    warm-up of 64 requests of the same shape that compiles what the shapes need."""
    eng = OPTS.bench_engine
    rng = random.Random(1000)
    n, length, out_len = SZ["k1_n"], SZ["k1_len"], SZ["k1_len"]
    run_batch(eng, [rand_ids(rng, length) for _ in range(min(n, 64))], [greedy(32)] * min(n, 64))
    reqs = [(rand_ids(rng, length), out_len) for _ in range(n)]
    res = _offline_pass(eng, reqs, steps=True)
    res["kv_pool_tokens"] = eng.runner.kv_pool.allocator.capacity_slots
    res["admission_rule"] = eng.server_args.admission_rule
    return res


def sec_offline_pdl_ab() -> dict:
    """`offline` (warm passes) with every CUDA graph captured with the PDL trigger before the wait
    (early, the default), then after it (late), then early again, in one process, so the
    machine's bandwidth is the same for both settings."""
    return _offline_settings_ab("pdl_early_trigger", (("early", True), ("late", False), ("early_again", True)))


def _offline_settings_ab(field: str, values: tuple, apply=None) -> dict:
    """`offline` once per (label, value) in `values`, with the bench engine's kernel setting `field`
    at that value for the whole run (eager passes and recaptured graphs), in one process; the
    settings before are restored after. `apply(runner, settings)` switches them (default:
    set_kernel_settings, which captures the decode graphs again)."""
    runner, out = OPTS.bench_engine.runner, {}
    apply = apply or (lambda r, settings: r.set_kernel_settings(settings))
    before = runner.settings
    try:
        for label, value in values:
            apply(runner, dataclasses.replace(before, **{field: value}))
            out[label] = sec_offline()
    finally:
        apply(runner, before)
    return out


def sec_offline_residual_ab() -> dict:
    """`offline` with the residual stream in float32 (the default), in bf16, then float32 again:
    what the float32 stream costs at large batches."""
    return _offline_settings_ab("fp32_residual", (("float32", True), ("bf16", False), ("float32_again", True)))


def sec_offline_p_parts_ab() -> dict:
    """`offline` with attention's p in 2, 1, then 2 bf16 parts again."""
    return _offline_settings_ab("attention_p_parts", (("p2", 2), ("p1", 1), ("p2_again", 2)))


def sec_offline_flash_ab() -> dict:
    """`offline` with prompt-only prefill rows through torch's flash kernel (the default where it runs),
    then through the Triton extend kernel."""
    out = {"flash_enabled": flash_prefill_on(OPTS.bench_engine)}
    ab = _offline_settings_ab("flash_prefill", (("flash_on", True), ("flash_off", False)), apply=set_extend_settings)
    out.update(ab)
    return out


def sec_offline_arms() -> dict:
    """`offline` (its cold pass, every seed, its deadline) as built (base), then with prefill chunks of 16,384
    tokens (chunk16k: half the extend passes, each twice the rows), in one engine; each arm's first-seed pass
    records its steps. The chunk size is restored after."""
    args = OPTS.bench_engine.scheduler.args
    base_chunk, out = args.chunked_prefill_size, {}
    try:
        for arm, chunk in (("base", base_chunk), ("chunk16k", 16384)):
            args.chunked_prefill_size = chunk
            out[arm] = sec_offline()
            log(f"offline_arms {arm}: {out[arm]['out_tok_s']:.0f} out tok/s (median over seeds)")
    finally:
        args.chunked_prefill_size = base_chunk
    return out


def decode_entry(path: str) -> dict:
    """The `bf16` entry for DECODE_CONFIG that `offline_decode_ab` times against no entry: `path`'s `entry`
    (benchmarks/bf16_attn_bench.py's bf16_attn_best.json), or without a path DECODE_CONFIG's own. ValueError for
    a path that is missing, an entry that is missing, empty or not an object, or one with a key DECODE_CONFIG
    does not know (either would make the A/B an A/A)."""
    from radixflow.kernels import decode_attention as da

    if not path:
        entry, source = da.DECODE_CONFIG["bf16"], "DECODE_CONFIG's `bf16` entry"
    elif not os.path.isfile(path):
        raise ValueError(f"--decode-entry {path}: no such file")
    else:
        with open(path) as f:
            entry, source = json.load(f).get("entry"), f"--decode-entry {path}"
    if not entry or not isinstance(entry, dict):
        raise ValueError(f"offline_decode_ab: {source} is {entry!r}, not an entry to time against no entry "
                         "(bf16_attn_bench.py writes null when the 4-warp launch won)")
    da._check_keys({"bf16": entry})
    return entry


def _with_bf16_entry(runner, entry: dict) -> None:
    """DECODE_CONFIG's `bf16` entry set to `entry` and, if that changed it, the decode graphs captured again (they
    bake the launch in)."""
    from radixflow.kernels import decode_attention as da

    if da.DECODE_CONFIG["bf16"] == entry:
        return
    da.DECODE_CONFIG["bf16"] = entry
    runner.set_kernel_settings(runner.settings)


def sec_offline_decode_ab() -> dict:
    """`offline` (cold pass, every seed) with no `bf16` entry in DECODE_CONFIG (`no_entry`: the 4-warp launch at
    every batch size), then with `decode_entry`'s (`entry`), in one engine, the decode graphs captured again for
    each arm: the same two arms whatever DECODE_CONFIG holds when it runs. Then, while --deadline-s allows a
    recapture and a pass (~45 s), each arm once more on the first seed alone (`no_entry_2`, `entry_2`), so a drift
    over the run shows. Results are saved after every arm; DECODE_CONFIG's entry is restored after."""
    from radixflow.kernels import decode_attention as da

    runner, entry = OPTS.bench_engine.runner, decode_entry(OPTS.decode_entry)
    built = da.DECODE_CONFIG["bf16"]
    arms = [("no_entry", {}), ("entry", entry)]
    out: dict = {"decode_entry": entry}
    RESULTS[OPTS.section_key] = out
    try:
        for label, arm_entry in arms:
            _with_bf16_entry(runner, arm_entry)
            out[label] = sec_offline()
            save()
            log(f"offline_decode_ab {label}: {out[label]['out_tok_s']:.0f} out tok/s (median over seeds)")
        seed = int(OPTS.offline_seeds.split(",")[0])
        for label, arm_entry in arms:
            if past_deadline(margin_s=45):
                break
            _with_bf16_entry(runner, arm_entry)
            out[f"{label}_2"] = _offline_pass(OPTS.bench_engine, offline_requests(seed))
            save()
            log(f"offline_decode_ab {label}_2 (seed {seed}): {out[f'{label}_2']['out_tok_s']:.0f} out tok/s")
    finally:
        _with_bf16_entry(runner, built)
    return out


def sec_shared() -> dict:
    """Radix cache on (twice: the first pass of a fresh engine compiles Triton kernels for the
    long-prefix shapes, and is kept as "radix_on_cold"),
    then off in a fresh engine of the same process (the kernels compiled by then)."""
    rng = random.Random(5)
    common = rand_ids(rng, SZ["shared_len"])
    prompts = [common + rand_ids(rng, 128) for _ in range(SZ["shared_n"])]
    params = [greedy(SZ["shared_out"])] * len(prompts)
    out = {"radix_on_cold": run_batch(OPTS.bench_engine, prompts, params)}
    out["radix_on"] = run_batch(OPTS.bench_engine, prompts, params)
    log(f"shared radix on: {out['radix_on']}")
    free(OPTS.bench_engine)  # the radix-off engine sizes its KV pool from the free memory
    OPTS.bench_engine = None
    eng = make_engine("llama3-8b", disable_radix_cache=True, **OPTS.bench_kw)
    try:
        out["radix_off"] = run_batch(eng, prompts, params)
    finally:
        free(eng)
    out["speedup"] = out["radix_off"]["s"] / out["radix_on"]["s"]
    return out


def _host_profile(eng, prompts: list, params: list) -> list:
    """cProfile of the engine loop (host side), top functions by cumulative time."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    run_batch(eng, prompts, params)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(45)
    with open(os.path.join(OPTS.out, "idle_host_profile.txt"), "w") as f:
        f.write(buf.getvalue())
    stats = pstats.Stats(prof).stats
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:12]  # by own (total) time
    return [(f"{os.path.basename(k[0])}:{k[2]}", round(v[2], 3), v[1]) for k, v in rows]


def _idle_run(eng, prompts: list, params: list) -> dict:
    bs = len(prompts)
    rec = ForwardRecorder(eng.runner)
    try:
        res = run_batch(eng, prompts, params)
    finally:
        rec.close()
    dec = [r for r in rec.records if r[0] == "decode" and r[1] == bs]
    busy = [s.elapsed_time(e) for _, _, s, e, _ in dec]
    gaps = [a[3].elapsed_time(b[2]) for a, b in zip(dec, dec[1:])]
    host = [b[4] - a[4] for a, b in zip(dec, dec[1:])]
    return {"decode_steps": len(dec), "gpu_forward_ms": statistics.median(busy), "gap_ms": statistics.median(gaps),
            "host_step_ms": 1e3 * statistics.median(host), "idle_fraction": sum(gaps) / (sum(gaps) + sum(busy[1:])),
            "out_tok_s": res["out_tok_s"]}


def sec_idle() -> dict:
    """GPU idle between decode steps at batch idle_bs: overlap scheduling on (the default
    on CUDA) and off, in the same run."""
    eng = OPTS.bench_engine
    rng = random.Random(11)
    bs = SZ["idle_bs"]
    prompts, params = [rand_ids(rng, 128) for _ in range(bs)], [greedy(SZ["idle_out"])] * bs
    sched = eng.scheduler
    out = {}
    for name, on in (("overlap_off", False), ("overlap_on", True)):
        sched.overlap = on
        out[name] = _idle_run(eng, prompts, params)
    out["host_top_self_s"] = _host_profile(eng, prompts, params)
    return out
