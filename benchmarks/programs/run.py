"""Runs the SGLang paper's program workloads (workloads.py) three ways in one process, on
one in-process Engine, all programs of a workload in flight at once (run_async):

- graph: request graphs where the program can be traced (else eager);
- eager: one request per gen/select, with the radix cache;
- eager-noradix: the same with prefix reuse turned off (the tree disabled while empty).

Reports programs/s, p50 latency, the achieved cache hit rate (cached / prompt tokens the
scheduler saw: admissions, and in graph mode each continued request's new segment as the
prompt a new request would have had) and the optimal one: the share of the eager run's
prompt tokens that an unbounded cache could have served from earlier prompts and outputs
(each request computing at least one token). With --repeats R each mode runs R times,
interleaved (no radix, then graph and eager in an order swapped every round; with fewer
--baseline-repeats, the no-radix rounds after all the others), and the table gives medians
(graph / eager: the median of the rounds' paired ratios, with their range). Every
mode first runs one untimed warm-up round; --min-round-s S lengthens rounds shorter than S (k * n
programs, n in flight, the same k for every mode), so one pause cannot decide a 0.2 s round.

    python benchmarks/programs/run.py                       # CPU, default model, small sizes
    python benchmarks/programs/run.py --smoke               # two programs of each, a few tokens
    python benchmarks/programs/run.py --device cuda --config benchmarks/configs/llama3-8b.json \\
        --load-format dummy --tokenizer .gpu_assets/tokenizer --n 64 --size 1.0 --repeats 2 --min-round-s 0.5

On CUDA a second table gives each mode's GPU busy time (events around every forward pass,
summed), its host-only time (the rest of the wall time) and graph / no radix with either
column's host-only time zero (bound_table); bound_floor.py adds the roofline floors. With
--kernel-time, one more round per mode under torch.profiler gives the kernels' own busy time.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import math
import os
import random
import statistics
import sys
import time
from typing import Callable, Optional

FROZEN_AT_START = gc.get_freeze_count()  # before torch and radixflow: names who froze what the engine finds frozen
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import radixflow as rf  # noqa: E402
from radixflow.lang.backends.engine_backend import EngineBackend  # noqa: E402
from jit_variants import compiled_variants, new_variants  # noqa: E402
from pass_timer import GcPauses, KernelTime, Timeline  # noqa: E402
from workloads import BY_NAME, WORKLOADS, Workload  # noqa: E402

MODES = ("graph", "eager", "eager-noradix")


class PromptRecorder:
    """Wraps an EngineBackend's calls to keep every (prompt, output) it sends, in the order
    they finish (for the optimal hit rate)."""

    def __init__(self, backend: EngineBackend):
        self.backend, self.calls, self._call = backend, [], backend._call
        backend._call = self.call

    def call(self, payload: dict):
        out = self._call(payload)
        ids = payload.get("input_ids")
        if ids:
            prompts = ids if isinstance(ids[0], list) else [ids]
            outs = out if isinstance(out, list) else [out]
            self.calls.extend((p, o["output_ids"]) for p, o in zip(prompts, outs))
        return out

    def close(self) -> None:
        self.backend._call = self._call


def optimal_hit_rate(calls: list) -> float:
    """Prompt tokens an unbounded cache holds (earlier prompts and outputs), each request
    computing at least its last prompt token."""
    root: dict = {}
    total = hit = 0
    for prompt, output in calls:
        node, depth = root, 0
        while depth < len(prompt) - 1 and prompt[depth] in node:
            node, depth = node[prompt[depth]], depth + 1
        total += len(prompt)
        hit += depth
        node = root
        for t in list(prompt) + list(output):
            node = node.setdefault(t, {})
    return hit / total if total else 0.0


def run_mode(
    engine: rf.Engine, workload: Workload, inputs: list, mode: str, sampling: dict, in_flight: Optional[int] = None
) -> dict:
    """All `inputs` as one round, at most `in_flight` programs at once (all of them by default)."""
    sched = engine.scheduler
    engine.stepper.exclusive(sched.flush_cache)
    sched.tree.disable = mode == "eager-noradix"  # the tree is empty: as --disable-radix-cache
    stats = sched.stats
    before = (stats.prompt_tokens, stats.cached_tokens, stats.forward_steps, stats.extend_tokens, stats.decode_tokens)
    run_mode_name = "eager" if mode.startswith("eager") else "auto"
    lat: list = []

    async def one(kw: dict, slots: asyncio.Semaphore):
        async with slots:
            t = time.perf_counter()
            state = await workload.program.run_async(backend=engine, mode=run_mode_name, **kw, **sampling)
            lat.append(time.perf_counter() - t)
            return state

    async def all_of():
        slots = asyncio.Semaphore(in_flight or len(inputs))
        return await asyncio.gather(*(one(kw, slots) for kw in inputs))

    variants = compiled_variants()
    start, cpu = time.perf_counter(), time.process_time()
    try:
        with Timeline(engine) as tl, GcPauses() as gcs:
            states = asyncio.run(all_of())
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            host_ms, model_s, steps = tl.host_ms_per_pass(wall), tl.model_seconds(), tl.steps
    finally:
        sched.tree.disable = engine.server_args.disable_radix_cache
    prompt = stats.prompt_tokens - before[0]
    cached = stats.cached_tokens - before[1]
    return {
        "mode": states[0].mode,
        "throughput": len(inputs) / wall,
        "cpu_per_program": cpu / len(inputs),
        "p50": statistics.median(lat),
        "hit": cached / prompt if prompt else 0.0,
        "forward_steps": stats.forward_steps - before[2],
        "extend_tokens": stats.extend_tokens - before[3],
        "decode_tokens": stats.decode_tokens - before[4],
        "host_ms_per_pass": host_ms,
        "model_s": model_s,  # GPU time of the forward passes on CUDA (pass_timer), wall inside them on CPU
        "gpu_s": model_s if tl.cuda else None,  # the GPU's busy time; not measured on the CPU
        "round_s": wall,
        "scheduler_steps": steps,  # what host_ms_per_pass divides by: model_s + host_ms x steps = the round
        "gc_full": gcs.full,
        "gc_ms": 1000 * gcs.seconds,
        "jit_compiles": new_variants(variants),  # Triton variants compiled in the round: their compile counts as GPU busy
    }


def run_workload(
    engine, workload, n: int, size: float, sampling: dict, seed: int, repeats: int = 1, min_round_s: float = 0.0,
    freeze_gc: bool = True, kernel_time: bool = False, modes: tuple = MODES, waves: Optional[int] = None,
    baseline_repeats: Optional[int] = None,
) -> dict:  # fmt: skip
    """Each of `modes` `repeats` times (no radix `baseline_repeats` times, if given), in round_plan's
    order (graph and eager adjacent, their order swapped every round); the optimal hit rate from the
    first eager run.
    A round is n programs, all in flight; with min_round_s, k * n programs with n in flight,
    k the smallest making the faster warm-up round (graph, eager) last min_round_s (the same k
    for every mode), or k = `waves` when given (another engine's, so that both run the same rounds).
    With freeze_gc, the engine's freeze_gc() after the warm-ups; with kernel_time, one more round
    per mode under the profiler (kernel_round_s). A round during which Triton compiled a kernel variant
    runs again once; the first run is kept apart (`compiling_rounds`)."""
    inputs, waves = warm_up(engine, workload, n, size, sampling, seed, min_round_s, modes, waves)
    frozen = engine.freeze_gc() if freeze_gc else 0  # what the warm-ups made: no full collection walks it in the rounds
    runs: dict = {m: [] for m in modes}
    out: dict = {"programs_per_round": len(inputs), "in_flight": n, "waves": waves, "frozen_after_warm_up": frozen}
    for mode in round_plan(repeats, baseline_repeats, modes):
        rec = PromptRecorder(EngineBackend.for_engine(engine)) if mode == "eager" and not runs["eager"] else None
        try:
            run = run_mode(engine, workload, inputs, mode, sampling, in_flight=n)
        finally:
            if rec is not None:
                rec.close()
                out["optimal_hit"] = optimal_hit_rate(rec.calls)
        if run["jit_compiles"]:  # a first compile inside a pass: not a steady-state round, so it runs again (once)
            out.setdefault("compiling_rounds", []).append({"round": mode, **run})
            run = run_mode(engine, workload, inputs, mode, sampling, in_flight=n)
        runs[mode].append(run)
    for mode, rs in runs.items():
        out[mode] = {
            "mode": rs[0]["mode"],
            "throughput": programs_per_s(rs),
            "p50": statistics.median(r["p50"] for r in rs),
            "cpu_per_program": statistics.median(r["cpu_per_program"] for r in rs),
            "hit": statistics.median(r["hit"] for r in rs),
            "forward_steps": statistics.median(r["forward_steps"] for r in rs),
            "host_ms_per_pass": statistics.median(r["host_ms_per_pass"] for r in rs),
            "model_s": statistics.median(r["model_s"] for r in rs),
            "gc_ms": statistics.median(r["gc_ms"] for r in rs),
            **busy_totals(rs),
            "runs": rs,
        }
    if "graph" in runs and "eager" in runs:
        out["graph_vs_eager"] = [g["throughput"] / e["throughput"] for g, e in zip(runs["graph"], runs["eager"])]
    if kernel_time:
        for mode in modes:
            out[mode]["kernel_s"] = kernel_round_s(engine, workload, inputs, mode, sampling, n)
    return out


def warm_up(engine, workload, n: int, size: float, sampling: dict, seed: int, min_round_s: float, modes: tuple,
            waves: Optional[int]) -> tuple[list, int]:
    """The untimed warm-up rounds, every mode through the timed path (first-use costs, such as kernel
    compiles of this workload's shapes and the process's first run_async, stay out of the rounds);
    returns the round's inputs and its waves (n programs each). No radix warms up first, so that the
    first timed run follows a graph or eager run, as round_plan's do with fewer no-radix rounds.
    Every mode warms up twice, the second time at the round's size, also with one wave: after one
    warm-up each, the process's first workload still paid a first use in its first timed round
    (H200, session 12: mmlu's first graph round at 0.23x eager, with 3.5x its GPU-busy time)."""
    inputs = workload.inputs(random.Random(seed), n, size)
    ordered = sorted(modes, key=lambda m: m != "eager-noradix")  # stable: graph before eager
    if waves is None:
        if "eager-noradix" in modes:
            run_mode(engine, workload, inputs, "eager-noradix", sampling)
        warm = [run_mode(engine, workload, inputs, mode, sampling) for mode in MODES[:2]]
        waves = round_waves(min_round_s, max(r["throughput"] for r in warm), n)  # the faster: the first run pays first uses
    if waves > 1:
        inputs = workload.inputs(random.Random(seed), waves * n, size)
    for mode in ordered:  # every mode again, at the round's size, no radix first
        run_mode(engine, workload, inputs, mode, sampling, in_flight=n)
    return inputs, waves


def kernel_round_s(engine, workload, inputs: list, mode: str, sampling: dict, in_flight: int) -> Optional[float]:
    """One more round of `mode`, untimed, under the profiler: the GPU's kernel-busy seconds in
    it (None without CUDA)."""
    with KernelTime(str(engine.runner.device).startswith("cuda")) as kt:
        run_mode(engine, workload, inputs, mode, sampling, in_flight=in_flight)
    return kt.seconds


def programs_per_s(rounds: list) -> float:
    """A mode's programs over its total time across rounds (each round runs the same
    programs, so: the harmonic mean of the rounds' throughputs). The mean of the rounds'
    throughputs would let one fast round outweigh a slow one, e.g. a round with a full
    garbage collection."""
    return len(rounds) / sum(1 / r["throughput"] for r in rounds)


def busy_totals(rounds: list) -> dict:
    """A mode's wall and GPU-busy seconds summed over its rounds, and the tokens its passes
    computed a round (median). gpu_s is None on the CPU, where the GPU's time is not measured."""
    gpu = None if any(r.get("gpu_s") is None for r in rounds) else sum(r["gpu_s"] for r in rounds)
    return {
        "total_s": sum(r["round_s"] for r in rounds),
        "total_gpu_s": gpu,
        "extend_tokens": statistics.median(r["extend_tokens"] for r in rounds),
        "decode_tokens": statistics.median(r["decode_tokens"] for r in rounds),
    }


def round_order(r: int) -> tuple:
    """The modes of round r: no radix first, then graph and eager back to back, their order
    swapped every round. So each of the two compared modes follows the no-radix round (whose
    churned KV pool and garbage the next round inherits) as often as the other, and each
    round's graph / eager ratio pairs two adjacent runs."""
    return ("eager-noradix", "graph", "eager") if r % 2 == 0 else ("eager-noradix", "eager", "graph")


def round_plan(repeats: int, baseline_repeats: Optional[int] = None, modes: tuple = MODES) -> list:
    """The timed runs in order: round_order's rounds; with fewer no-radix rounds (baseline_repeats),
    graph and eager alone in the rounds and the no-radix ones after them all, so that neither compared
    mode follows a no-radix run more often than the other (none does)."""
    if baseline_repeats is None or baseline_repeats == repeats:
        return [m for r in range(repeats) for m in round_order(r) if m in modes]
    paired = [m for r in range(repeats) for m in round_order(r)[1:] if m in modes]
    return paired + ["eager-noradix"] * baseline_repeats * ("eager-noradix" in modes)


def round_waves(min_round_s: float, programs_per_s: float, n: int, most: int = 8) -> int:
    """How many times n programs a round needs to last min_round_s at programs_per_s (1 to `most`)."""
    return max(1, min(most, math.ceil(min_round_s * programs_per_s / n))) if min_round_s > 0 else 1


def run_all(
    engine, names: list, n: int, size: float, sampling: dict, seed: int = 0, repeats: int = 1,
    deadline: Optional[float] = None, on_workload: Optional[Callable[[dict], None]] = None, min_round_s: float = 0.0,
    freeze_gc: bool = True, kernel_time: bool = False, modes: tuple = MODES, like: Optional[dict] = None,
    baseline_repeats: Optional[int] = None,
) -> dict:  # fmt: skip
    """Each workload in turn; none is started after `deadline` (time.time()); on_workload
    gets the results so far after each. `like`: another engine's results, whose rounds (waves) each
    workload repeats (modes other than MODES need it)."""
    unknown = [name for name in names if name not in BY_NAME]
    if unknown:
        raise SystemExit(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(BY_NAME)}")
    results = {}
    for name in names:
        if deadline is not None and time.time() > deadline:
            print(f"{name}: skipped (past the deadline)", file=sys.stderr, flush=True)
            continue
        t = time.perf_counter()
        waves = like[name]["waves"] if like else None
        results[name] = run_workload(engine, BY_NAME[name], n, size, sampling, seed, repeats, min_round_s, freeze_gc,
                                     kernel_time, modes, waves, baseline_repeats)
        if like:
            borrow_modes(results[name], like[name])
        results[name]["tracked_after"] = tracked_objects()
        print(f"{name}: {time.perf_counter() - t:.1f}s, then {results[name]['tracked_after']['tracked']} objects tracked by the GC",
              file=sys.stderr, flush=True)  # fmt: skip
        print(table({name: results[name]}).splitlines()[2], file=sys.stderr, flush=True)  # the row so far
        for run in results[name].get("compiling_rounds", []):
            print(f"{name}: a {run['round']} round compiled Triton variants {run['jit_compiles']}; it ran again, "
                  f"and only the second run counts", file=sys.stderr)
        for mode in MODES:
            for run in results[name].get(mode, {}).get("runs", []):
                if run.get("jit_compiles"):
                    print(f"{name}: a {mode} round that counts compiled {run['jit_compiles']}", file=sys.stderr)
        if on_workload is not None:
            on_workload(results)
    print(f"Triton variants compiled in this process: {sum(compiled_variants().values())}", file=sys.stderr)
    return results


def frozen_garbage() -> dict:
    """What freezing kept: objects frozen alive that died in reference cycles since, which only a
    collection after unfreezing frees (their count). Then everything alive is frozen, more than
    before (what the rounds made too): a --timeline after it runs with fewer objects walked."""

    gc.collect()  # the garbage that was never frozen
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    freed = gc.collect()
    gc.freeze()
    return {"frozen": frozen, "freed_after_unfreezing": freed}


def tracked_objects(top: int = 8) -> dict:
    """What a full garbage collection would walk now: the objects the collector tracks (frozen
    ones apart) and the most common types among them."""
    from collections import Counter

    objs = gc.get_objects()
    out = {"tracked": len(objs), "frozen": gc.get_freeze_count(),
           "types": Counter(type(o).__name__ for o in objs).most_common(top)}  # fmt: skip
    del objs
    return out


def over(n: int, skipped: list = ()) -> str:
    """"over N workloads", or "over N of M workloads (skipped: ...)" when the deadline cut some."""
    if not skipped:
        return f"over {n} workloads"
    return f"over {n} of {n + len(skipped)} workloads (skipped past the deadline: {', '.join(skipped)})"


def table(results: dict, skipped: list = ()) -> str:
    """Programs/s: programs over total time across the repeats; the other columns are medians
    over the repeats; graph / eager is the median of the per-round ratios, with their range.
    CPU s / program: this process's CPU time (all threads) per program, which a shared
    machine's load disturbs far less than wall time. Forward passes: the scheduler steps that
    ran the model (median over rounds), the work itself, which load does not change. Host ms /
    pass: the wall time not spent in the model's forward passes (GPU time on CUDA), per pass.
    GC ms / round: time in the cyclic garbage collector (any thread) during the round."""
    lines = [
        "| workload | graph programs/s | eager | eager, no radix | graph / eager (range) | graph / no radix | p50 graph / eager / no radix (s) | CPU s / program graph / eager / no radix | forward passes graph / eager | host ms / pass graph / eager / no radix | GC ms / round graph / eager / no radix | hit rate graph / eager / optimal |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    ratios = []
    for name, r in results.items():
        g, e, x = r["graph"], r["eager"], r["eager-noradix"]
        ratios.append(g["throughput"] / x["throughput"])
        tag = "" if g["mode"] == "graph" else " (eager: not traceable)"
        if r.get("programs_per_round", 0) > r.get("in_flight", 0):
            tag += f" ({r['programs_per_round']} a round)"
        tag += _borrowed(r)
        ge = r.get("graph_vs_eager") or [g["throughput"] / e["throughput"]]
        spread = f" ({min(ge):.2f}-{max(ge):.2f})" if len(ge) > 1 else ""
        lines.append(
            f"| {name}{tag} | {g['throughput']:.2f} | {e['throughput']:.2f} | {x['throughput']:.2f} | "
            f"{statistics.median(ge):.2f}x{spread} | {g['throughput'] / x['throughput']:.2f}x | "
            f"{g['p50']:.2f} / {e['p50']:.2f} / {x['p50']:.2f} | {_cpu(g)} / {_cpu(e)} / {_cpu(x)} | "
            f"{_steps(g)} / {_steps(e)} | {_host(g)} / {_host(e)} / {_host(x)} | {_gc(g)} / {_gc(e)} / {_gc(x)} | {g['hit']:.2f} / {e['hit']:.2f} / {r['optimal_hit']:.2f} |"
        )
    geo = math.exp(sum(math.log(v) for v in ratios) / len(ratios))
    return "\n".join(lines + ["", f"Geometric mean {over(len(ratios), skipped)}, graph vs eager without radix cache: "
                                   f"**{geo:.2f}x**."])  # fmt: skip


BOUND_NOTE = ("GPU busy time: not measured (no CUDA device; the model's time on the CPU is the wall time "
              "inside its forward passes, model_s), so no zero-host bound.")


def bound_table(results: dict, skipped: list = ()) -> str:
    """Where the time goes, per mode and workload, over all rounds: a round's wall time, the GPU's
    busy time (CUDA events around each forward pass, summed) and the rest (host-only time: the
    wall time with no forward pass on the GPU), and graph / no radix three ways: measured; with
    graph mode's host-only time zero; with both columns' host-only time zero (GPU busy against
    GPU busy: what the forward passes' own work allows)."""
    rows = {k: r for k, r in results.items() if r["graph"].get("total_gpu_s") is not None}
    if not rows:
        return BOUND_NOTE
    lines = [
        "| workload | round s graph / eager / no radix | GPU busy s a round graph / eager / no radix | host-only s a round graph / eager / no radix | tokens computed a round graph / no radix (prefill + decode) | graph / no radix, measured | graph host-only zero | both host-only zero |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    ratios: list = []
    for name, r in rows.items():
        g, e, x = r["graph"], r["eager"], r["eager-noradix"]
        per = lambda m, key: m[key] / len(m["runs"])  # noqa: E731  (--baseline-repeats: fewer no-radix rounds)
        row = (per(x, "total_s") / per(g, "total_s"), per(x, "total_s") / per(g, "total_gpu_s"),
               per(x, "total_gpu_s") / per(g, "total_gpu_s"))
        ratios.append(row)
        lines.append(
            f"| {name}{_borrowed(r)} | {_per_round(lambda m: m['total_s'], g, e, x)} | {_per_round(lambda m: m['total_gpu_s'], g, e, x)} | "
            f"{_per_round(lambda m: m['total_s'] - m['total_gpu_s'], g, e, x)} | "
            f"{_tokens(g)} / {_tokens(x)} | {row[0]:.2f}x | {row[1]:.2f}x | {row[2]:.2f}x |"
        )
    geo = [math.exp(sum(math.log(r[i]) for r in ratios) / len(ratios)) for i in range(3)]
    text = "\n".join(lines + ["", f"Geometric means {over(len(ratios), skipped)}, graph vs eager without radix cache: "
                                   f"measured **{geo[0]:.2f}x**; graph mode's host-only time zero **{geo[1]:.2f}x**; "
                                   f"both columns' host-only time zero **{geo[2]:.2f}x**."])  # fmt: skip
    return text + kernel_lines(rows)


def kernel_lines(rows: dict) -> str:
    """With --kernel-time: each mode's kernel-busy seconds in its profiled round against its GPU
    busy time a round (events around passes), and graph / no radix on kernel time alone."""
    have = {k: r for k, r in rows.items() if all(r[m].get("kernel_s") for m in MODES)}
    if not have:
        return ""
    lines = ["", "| workload | kernel-busy s graph / eager / no radix | kernel / GPU busy graph / no radix | both at kernel time |",
             "| --- | --- | --- | --- |"]  # fmt: skip
    ratios = []
    for name, r in have.items():
        g, e, x = r["graph"], r["eager"], r["eager-noradix"]
        ratios.append(x["kernel_s"] / g["kernel_s"])
        share = lambda m: m["kernel_s"] / (m["total_gpu_s"] / len(m["runs"]))  # noqa: E731
        lines.append(f"| {name} | {g['kernel_s']:.3f} / {e['kernel_s']:.3f} / {x['kernel_s']:.3f} | "
                     f"{share(g):.2f} / {share(x):.2f} | {ratios[-1]:.2f}x |")  # fmt: skip
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    return "\n".join(lines + ["", f"Geometric mean over {len(ratios)} workloads at kernel time: **{geo:.2f}x**."])


def _borrowed(r: dict) -> str:
    """The tag of a later engine's row whose other modes are the first engine's (borrow_modes)."""
    return f" ({', '.join(r['borrowed'])}: the first engine's)" if r.get("borrowed") else ""


def _per_round(seconds: Callable[[dict], float], *modes: dict) -> str:
    return " / ".join(f"{seconds(m) / len(m['runs']):.3f}" for m in modes)


def _tokens(r: dict) -> str:
    return f"{r['extend_tokens']:g} + {r['decode_tokens']:g}"


def _cpu(r: dict) -> str:
    return f"{r['cpu_per_program']:.3f}" if "cpu_per_program" in r else "-"


def _host(r: dict) -> str:
    return f"{r['host_ms_per_pass']:.1f}" if "host_ms_per_pass" in r else "-"


def _gc(r: dict) -> str:
    return f"{r['gc_ms']:.0f}" if "gc_ms" in r else "-"


def _steps(r: dict) -> str:
    return f"{r['forward_steps']:g}" if "forward_steps" in r else "-"


def extend_graph_settings(text: str) -> list:
    """--extend-graph-tokens: engine settings of --cuda-graph-extend-max-tokens, each >= 0, or `default`
    (the engine's own: on where the graphs can run)."""
    try:
        values = [v if v == "default" else int(v) for v in text.split(",")]
    except ValueError:
        raise SystemExit(f"--extend-graph-tokens {text!r}: comma-separated integers or 'default', e.g. 0,512") from None
    if any(v != "default" and v < 0 for v in values) or len(set(values)) != len(values):
        raise SystemExit(f"--extend-graph-tokens {text!r}: distinct values >= 0 (0: no extend graphs)")
    return values


def run_engine(args, kw: dict, sampling: dict, budget_s: Optional[float], save: Callable[[dict], None],
               extra: dict, like: Optional[dict] = None) -> dict:
    """One engine through every workload (and the timelines), its memory freed afterwards (Engine.shutdown
    drops the runner; the allocator's cache is emptied), so that the next engine of --extend-graph-tokens
    sizes its KV pool from about the same free memory; the free memory is logged before each engine.
    budget_s: seconds, counted from when the engine is up, after which no workload or timeline starts.
    `like`: the first engine's results; this engine then runs --later-modes on its workloads and rounds."""
    if torch.cuda.is_available():
        print(f"free GPU memory before the engine: {torch.cuda.mem_get_info()[0] / 2**30:.1f} GiB", file=sys.stderr)
    setting = kw.get("cuda_graph_extend_max_tokens", "default")
    start = time.perf_counter()
    with rf.Engine(args.config, **kw) as engine:
        extra.setdefault("engine_start_s", {})[setting] = time.perf_counter() - start
        deadline = None if budget_s is None else time.time() + budget_s  # the start-up is not the workloads' time
        note_capture(engine, setting, extra)
        wanted = args.workloads.split(",")
        names = [n for n in wanted if like is None or n in like]
        modes = tuple(m for m in MODES if like is None or m in args.later_modes.split(","))
        results = run_all(engine, names, args.n, args.size, sampling, args.seed, args.repeats, deadline, save,
                          args.min_round_s, not args.no_freeze_gc, args.kernel_time, modes, like,
                          args.baseline_repeats)  # fmt: skip
        skipped = [n for n in wanted if n not in results]
        extra.setdefault("skipped_workloads", {})[setting] = skipped
        extra["frozen_garbage"] = frozen_garbage()
        print(f"freezing kept {extra['frozen_garbage']['freed_after_unfreezing']} dead objects of "
              f"{extra['frozen_garbage']['frozen']} frozen", file=sys.stderr, flush=True)
        save(results)
        print(table(results, skipped))
        print(bound_table(results, skipped))
        for name in filter(None, args.timeline.split(",")):
            from step_timeline import print_rows, timeline

            if deadline is not None and time.time() > deadline:
                print(f"timeline {name}: skipped (past the deadline)", file=sys.stderr, flush=True)
                continue

            results.setdefault("timelines", {})[name] = timeline(engine, name, args.n, args.size, sampling)
            print_rows(name, results["timelines"][name])
            save(results)
        graphs = engine.runner.extend_graphs
        if graphs is not None:  # every mode's passes together, warm-up rounds included
            extra.setdefault("extend_graph_passes", {})[setting] = passes = {
                "extend_passes": graphs.extend_passes, "padded": graphs.replays}
            print(f"extend passes in a bucket (graphs on CUDA): {passes['padded']} of {passes['extend_passes']}",
                  file=sys.stderr, flush=True)
            save(results)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return results


def note_capture(engine, setting, extra: dict) -> None:
    """The extend graphs' capture: seconds and device memory against the estimate (CUDA only)."""
    graphs = engine.runner.extend_graphs
    cost = graphs.capture_cost if graphs is not None else None
    if cost is None:
        return
    extra.setdefault("extend_graph_capture", {})[setting] = dataclasses.asdict(cost)
    print(f"extend graphs ({setting}): {cost.graphs} captured in {cost.seconds:.1f} s, {cost.reserved_bytes / 2**20:.0f} "
          f"MiB reserved ({cost.peak_reserved_bytes / 2**20:.0f} MiB at the peak), {cost.allocated_bytes / 2**20:.0f} "
          f"MiB allocated (estimate {cost.estimate_bytes / 2**20:.0f} MiB)", file=sys.stderr, flush=True)  # fmt: skip


def borrow_modes(r: dict, first: dict) -> None:
    """The modes a workload's results `r` lack (--later-modes), and the optimal hit rate, from the first
    engine's results of it, listed in `borrowed` (the table's ratios then compare the two engines)."""
    r["borrowed"] = [m for m in MODES if m not in r]
    r.update({m: first[m] for m in r["borrowed"]})
    r.setdefault("optimal_hit", first["optimal_hit"])


def extend_graph_table(by_setting: dict, skipped: list = ()) -> str:
    """Each --extend-graph-tokens setting (an engine each; the extend graphs serve every mode) against
    the first: graph mode's programs/s, graph / no radix (issue 29's ratio; "first's no radix" where a
    later engine borrowed it) and graph mode's GPU busy seconds a round (CUDA: events around each pass)."""
    keys = list(by_setting)
    base = by_setting[keys[0]]
    lines = [f"By --cuda-graph-extend-max-tokens: graph programs/s (ratio to {keys[0]}); graph / no radix; "
             "graph GPU busy s a round", "", "| workload | " + " | ".join(f"max {k} tokens" for k in keys) + " |",
             "| --- |" + " --- |" * len(keys)]  # fmt: skip
    names = [name for name in base if name != "timelines"]
    missing = [name for name in names if any(name not in by_setting[k] for k in keys)]
    for name in (n for n in names if n not in missing):
        r0 = base[name]
        cells = []
        for k in keys:
            r = by_setting[k][name]
            g = r["graph"]
            gpu = g.get("total_gpu_s")
            lent = " (first's no radix)" if "eager-noradix" in r.get("borrowed", ()) else ""
            cells.append(f"{g['throughput']:.2f} ({g['throughput'] / r0['graph']['throughput']:.2f}x); "
                         f"{g['throughput'] / r['eager-noradix']['throughput']:.2f}x{lent}"
                         + (f"; {gpu / len(g['runs']):.3f} s" if gpu is not None else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    note = f"Rows {over(len(names) - len(missing), skipped)}" + (
        f"; not run by every setting: {', '.join(missing)}" if missing else "")
    return "\n".join(lines + ["", note + "."])


def main(argv=None) -> str:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default=",".join(w.name for w in WORKLOADS))
    ap.add_argument("--n", type=int, default=8, help="programs per workload, all in flight at once")
    ap.add_argument("--size", type=float, default=0.25, help="scale of the shared texts (1.0: the paper's)")
    ap.add_argument("--max-new-tokens", type=int, default=8, help="default cap of each gen")
    ap.add_argument("--smoke", action="store_true", help="2 programs per workload, tiny sizes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1, help="rounds of the three modes, interleaved; medians reported")
    ap.add_argument("--baseline-repeats", type=int, default=None,
                    help="timed rounds of eager-noradix (default: --repeats): its rounds are the longest, 1-11 s on "
                         "an H200, and one is enough where the device time is short")
    ap.add_argument("--min-round-s", type=float, default=0.0,
                    help="lengthen short rounds: k * n programs a round, n in flight, k (at most 8) from the faster "
                         "warm-up round of graph and eager")
    ap.add_argument("--no-freeze-gc", action="store_true",
                    help="do not call the engine's freeze_gc() after each workload's warm-up rounds")
    ap.add_argument("--kernel-time", action="store_true",
                    help="after each workload's rounds, one more per mode under torch.profiler: the GPU's kernel-busy "
                         "time, without the launch gaps inside a pass (CUDA only)")
    ap.add_argument("--json", default=None, help="also write the raw results here (after each workload)")
    ap.add_argument("--switch-interval-ms", type=float, default=None,
                    help="sys.setswitchinterval for this process (Python's default: 5 ms): how long a thread running "
                         "Python may keep the GIL from one that wants it back, e.g. the engine thread after a torch call")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="start no workload after this many seconds, counted from when the engine is up (skipped "
                         "ones are listed under the tables and in the JSON); with several --extend-graph-tokens the "
                         "first engine gets an equal share (all of it with fewer --later-modes) and the later ones "
                         "run the workloads it finished, with no deadline of their own")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--config", default=None, help="a model directory or config.json (with --load-format dummy)")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--max-total-tokens", type=int, default=None, help="KV pool size (default: the engine's)")
    ap.add_argument("--extend-graph-tokens", default="default",
                    help="engine --cuda-graph-extend-max-tokens ('default': the engine's own); several, comma-separated "
                         "(e.g. 512,0), run every workload once per value, one engine after another in this process, "
                         "and print graph mode's programs/s and GPU busy time for each")
    ap.add_argument("--later-modes", default=",".join(MODES),
                    help="with several --extend-graph-tokens: the modes the engines after the first run, graph among "
                         "them (always on the workloads the first finished and with its programs a round); the other "
                         "modes' figures are the first engine's, marked (e.g. 'graph': one no-radix baseline for all)")
    ap.add_argument("--extend-graph-reqs", type=int, default=None,
                    help="engine --cuda-graph-extend-max-reqs (default: the engine's)")
    ap.add_argument("--enable-mixed-chunk", action="store_true",
                    help="engine --enable-mixed-chunk: the running requests' next tokens in the extend passes")
    ap.add_argument("--timeline", default="", help="then these workloads' step timelines (step_timeline.py), same engine; none started past --deadline-s")
    args = ap.parse_args(argv)
    if args.smoke:
        args.n, args.size, args.max_new_tokens = 2, 0.05, 2
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    kw = {"device": args.device, "load_format": args.load_format}
    if args.tokenizer:
        kw["tokenizer_path"] = args.tokenizer
    if args.max_total_tokens:
        kw["max_total_tokens"] = args.max_total_tokens
    if args.extend_graph_reqs is not None:
        kw["cuda_graph_extend_max_reqs"] = args.extend_graph_reqs
    if args.enable_mixed_chunk:
        kw["enable_mixed_chunk"] = True
    sampling = {"max_new_tokens": args.max_new_tokens, "temperature": 0}

    extra: dict = {"frozen_at_start": FROZEN_AT_START, "frozen_after_imports": gc.get_freeze_count()}

    def save(results: dict) -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "results": results, **extra}, f, indent=1)

    if args.baseline_repeats is not None and not 1 <= args.baseline_repeats <= args.repeats:
        raise SystemExit(f"--baseline-repeats {args.baseline_repeats}: from 1 to --repeats ({args.repeats})")
    settings = extend_graph_settings(args.extend_graph_tokens)
    if set(args.later_modes.split(",")) - set(MODES) or "graph" not in args.later_modes.split(","):
        raise SystemExit(f"--later-modes {args.later_modes!r}: 'graph' (what the settings compare) and any of "
                         f"{', '.join(MODES[1:])}")
    by_setting: dict = {}
    for i, max_tokens in enumerate(settings):
        def save_setting(results: dict, key=max_tokens) -> None:
            by_setting[key] = results
            if len(settings) > 1:
                extra["by_extend_graph_tokens"] = by_setting
            save(by_setting[settings[0]])

        setting_kw = {} if max_tokens == "default" else {"cuda_graph_extend_max_tokens": max_tokens}
        like = by_setting[settings[0]] if i > 0 else None  # its workloads and rounds: no deadline of its own
        run_engine(args, {**kw, **setting_kw}, sampling, first_budget_s(args, len(settings)) if i == 0 else None,
                   save_setting, extra, like)  # fmt: skip
    results = by_setting[settings[0]]
    skipped = extra["skipped_workloads"][settings[0]]
    if len(settings) > 1:
        print(extend_graph_table(by_setting, skipped))
    kept = {k: v for k, v in results.items() if k != "timelines"}
    out = table(kept, skipped) + "\n\n" + bound_table(kept, skipped)
    return out + ("\n\n" + extend_graph_table(by_setting, skipped) if len(settings) > 1 else "")


def first_budget_s(args, engines: int) -> Optional[float]:
    """The first engine's --deadline-s share, counted from when it is up. Every later engine runs the
    workloads the first finished, with no deadline, so that each setting covers the same ones: with
    all modes in every engine each does about the first's work, so the first gets 1 / engines of it;
    with fewer --later-modes the later engines' rounds are short, and the first gets all of it."""
    if args.deadline_s is None:
        return None
    return args.deadline_s / (1 if set(args.later_modes.split(",")) != set(MODES) else engines)


if __name__ == "__main__":
    main()
