"""Request graph vs eager execution of the same LLM program against a CPU server.

A 5-gen template-filling program runs over N inputs, all in flight at once: as a
request graph (one POST /program each, executed inside the scheduler) and eagerly
(one POST /generate per gen). Reports end-to-end latency per program and throughput,
and appends them to BENCHMARKS.md.

    python benchmarks/program_graph.py [--n 64] [--max-tokens 6] [--no-record]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import radixflow as rf  # noqa: E402
from lang_programs import template_fill  # noqa: E402

NAMES = ["Ada", "Brian", "Chen", "Dara", "Emil", "Fatima", "Goran", "Hana"]


def run_mode(rt, mode: str, n: int, max_tokens: int) -> dict:
    rt.flush_cache()
    lat = [0.0] * n

    def one(i: int):
        t = time.perf_counter()
        s = template_fill.run(name=f"{NAMES[i % len(NAMES)]} #{i}", backend=rt, mode=mode, max_new_tokens=max_tokens, temperature=0)
        lat[i] = time.perf_counter() - t
        return s

    start = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        states = list(pool.map(one, range(n)))
    wall = time.perf_counter() - start
    assert all(s.mode == mode for s in states)
    return {
        "wall": wall,
        "mean": statistics.mean(lat),
        "p50": statistics.median(lat),
        "throughput": n / wall,
        "hit": rt.get_server_info()["cache_hit_rate"],
        "texts": [s.text() for s in states],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=6)
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    with rf.Runtime(max_total_tokens=32768, log_level="warning") as rt:
        run_mode(rt, "graph", 2, args.max_tokens)  # warm-up
        graph = run_mode(rt, "graph", args.n, args.max_tokens)
        eager = run_mode(rt, "eager", args.n, args.max_tokens)
    same = sum(a == b for a, b in zip(graph["texts"], eager["texts"]))
    ratio = graph["throughput"] / eager["throughput"]
    lines = [
        "| mode | wall (s) | mean e2e latency (s) | p50 (s) | programs/s | cache hit rate |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in (("request graph", graph), ("eager", eager)):
        lines.append(f"| {name} | {r['wall']:.1f} | {r['mean']:.1f} | {r['p50']:.1f} | {r['throughput']:.2f} | {r['hit']:.2f} |")
    summary = (
        f"Throughput ratio graph/eager: **{ratio:.2f}x** (target >= 1.5x); mean latency ratio "
        f"eager/graph {eager['mean'] / graph['mean']:.2f}x; identical greedy texts: {same}/{args.n}."
    )
    report = "\n".join(lines + ["", summary])
    print(report)
    if not args.no_record:
        _record(args, report)


def _record(args, report: str) -> None:
    path = os.path.join(os.path.dirname(__file__), "..", "BENCHMARKS.md")
    cmd = f"python benchmarks/program_graph.py --n {args.n} --max-tokens {args.max_tokens}"
    head = (
        f"\n## LLM programs: request graph vs eager ({datetime.date.today()}, 2-core CPU, torch {torch.__version__})\n\n"
        f"Command: `{cmd}`. A 5-gen template-filling program (tests/lang_programs.py `template_fill`), "
        f"{args.n} inputs in flight at once against `radixflow serve` (default SmolLM2-135M, CPU), greedy, "
        f"max {args.max_tokens} tokens per gen. Graph: one POST /program per program, gens continue the same "
        "request inside the scheduler. Eager: one POST /generate per gen (token ids sent; prefix from the radix cache).\n\n"
    )
    with open(path, "a") as f:
        f.write(head + report + "\n")


if __name__ == "__main__":
    main()
