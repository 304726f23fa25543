"""Runs the SGLang paper's program workloads (workloads.py) three ways in one process, on
one in-process Engine, all programs of a workload in flight at once (run_async):

- graph: request graphs where the program can be traced (else eager);
- eager: one request per gen/select, with the radix cache;
- eager-noradix: the same with prefix reuse turned off (the tree disabled while empty).

Reports programs/s, p50 latency, the achieved cache hit rate (cached / prompt tokens of
the scheduler's admissions; for graph mode the text appended to a continued request is
not counted) and the optimal one: the share of the eager run's prompt tokens that an
unbounded cache could have served from earlier prompts and outputs (each request
computing at least one token).

    python benchmarks/programs/run.py                       # CPU, default model, small sizes
    python benchmarks/programs/run.py --smoke               # two programs of each, a few tokens
    python benchmarks/programs/run.py --device cuda --config benchmarks/configs/llama3-8b.json \\
        --load-format dummy --tokenizer .gpu_assets/tokenizer --n 64 --size 1.0
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import radixflow as rf  # noqa: E402
from radixflow.lang.backends.engine_backend import EngineBackend  # noqa: E402
from workloads import BY_NAME, WORKLOADS  # noqa: E402

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


def run_mode(engine, workload, inputs: list, mode: str, sampling: dict) -> dict:
    sched = engine.scheduler
    engine.stepper.exclusive(sched.flush_cache)
    sched.tree.disable = mode == "eager-noradix"  # the tree is empty: as --disable-radix-cache
    before = (sched.stats.prompt_tokens, sched.stats.cached_tokens)
    run_mode_name = "eager" if mode.startswith("eager") else "auto"
    lat: list = []

    async def one(kw: dict):
        t = time.perf_counter()
        state = await workload.program.run_async(backend=engine, mode=run_mode_name, **kw, **sampling)
        lat.append(time.perf_counter() - t)
        return state

    async def all_of():
        return await asyncio.gather(*(one(kw) for kw in inputs))

    start = time.perf_counter()
    try:
        states = asyncio.run(all_of())
    finally:
        sched.tree.disable = engine.server_args.disable_radix_cache
    wall = time.perf_counter() - start
    prompt = sched.stats.prompt_tokens - before[0]
    cached = sched.stats.cached_tokens - before[1]
    return {
        "mode": states[0].mode,
        "throughput": len(inputs) / wall,
        "p50": statistics.median(lat),
        "hit": cached / prompt if prompt else 0.0,
    }


def run_workload(engine, workload, n: int, size: float, sampling: dict, seed: int) -> dict:
    inputs = workload.inputs(random.Random(seed), n, size)
    workload.program.run(backend=engine, **inputs[0], **sampling)  # warm-up, untimed
    out = {}
    rec = None
    for mode in MODES:
        if mode == "eager":
            rec = PromptRecorder(EngineBackend.for_engine(engine))
        try:
            out[mode] = run_mode(engine, workload, inputs, mode, sampling)
        finally:
            if rec is not None:
                rec.close()
        if mode == "eager":
            out["optimal_hit"] = optimal_hit_rate(rec.calls)
            rec = None
    return out


def run_all(engine, names: list, n: int, size: float, sampling: dict, seed: int = 0) -> dict:
    results = {}
    for name in names:
        if name not in BY_NAME:
            raise SystemExit(f"unknown workload {name!r}; choose from {', '.join(BY_NAME)}")
        t = time.perf_counter()
        results[name] = run_workload(engine, BY_NAME[name], n, size, sampling, seed)
        print(f"{name}: {time.perf_counter() - t:.1f}s", file=sys.stderr, flush=True)
        print(table({name: results[name]}).splitlines()[2], file=sys.stderr, flush=True)  # the row so far
    return results


def table(results: dict) -> str:
    lines = [
        "| workload | graph programs/s | eager | eager, no radix | graph / eager | graph / no radix | p50 graph / eager / no radix (s) | hit rate graph / eager / optimal |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    ratios = []
    for name, r in results.items():
        g, e, x = r["graph"], r["eager"], r["eager-noradix"]
        ratios.append(g["throughput"] / x["throughput"])
        tag = "" if g["mode"] == "graph" else " (eager: not traceable)"
        lines.append(
            f"| {name}{tag} | {g['throughput']:.2f} | {e['throughput']:.2f} | {x['throughput']:.2f} | "
            f"{g['throughput'] / e['throughput']:.2f}x | {g['throughput'] / x['throughput']:.2f}x | "
            f"{g['p50']:.2f} / {e['p50']:.2f} / {x['p50']:.2f} | {g['hit']:.2f} / {e['hit']:.2f} / {r['optimal_hit']:.2f} |"
        )
    geo = math.exp(sum(math.log(v) for v in ratios) / len(ratios))
    return "\n".join(lines + ["", f"Geometric mean, graph vs eager without radix cache: **{geo:.2f}x**."])


def main(argv=None) -> str:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default=",".join(w.name for w in WORKLOADS))
    ap.add_argument("--n", type=int, default=8, help="programs per workload, all in flight at once")
    ap.add_argument("--size", type=float, default=0.25, help="scale of the shared texts (1.0: the paper's)")
    ap.add_argument("--max-new-tokens", type=int, default=8, help="default cap of each gen")
    ap.add_argument("--smoke", action="store_true", help="2 programs per workload, tiny sizes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--config", default=None, help="a model directory or config.json (with --load-format dummy)")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--max-total-tokens", type=int, default=None, help="KV pool size (default: the engine's)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.n, args.size, args.max_new_tokens = 2, 0.05, 2
    kw = {"device": args.device, "load_format": args.load_format}
    if args.tokenizer:
        kw["tokenizer_path"] = args.tokenizer
    if args.max_total_tokens:
        kw["max_total_tokens"] = args.max_total_tokens
    sampling = {"max_new_tokens": args.max_new_tokens, "temperature": 0}
    with rf.Engine(args.config, **kw) as engine:
        results = run_all(engine, args.workloads.split(","), args.n, args.size, sampling, args.seed)
    report = table(results)
    print(report)
    return report


if __name__ == "__main__":
    main()
