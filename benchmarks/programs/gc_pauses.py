"""The cyclic garbage collector's pauses during program rounds, with the Engine's start-up
objects frozen (what `Engine()` does: runtime/gc_freeze.py, EngineFreeze) and unfrozen
(before), rounds alternating in one process: full collections and GC milliseconds per round,
and the wall time of each round. The order of the two states alternates from one repeat to the
next. The frozen state is `gc.freeze()` called between rounds, so it also freezes what the
warm-up and the earlier rounds left alive: a little more than `Engine()` alone freezes.

    python benchmarks/programs/gc_pauses.py --config benchmarks/configs/smollm2-tiny.json \\
        --load-format dummy --workloads mmlu,multi_turn_chat --n 64 --size 1.0 --repeats 3
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
import radixflow as rf  # noqa: E402
from run import MODES, run_mode  # noqa: E402
from workloads import BY_NAME  # noqa: E402


def rounds(engine: rf.Engine, name: str, n: int, size: float, sampling: dict, repeats: int) -> dict:
    w = BY_NAME[name]
    inputs = w.inputs(random.Random(0), n, size)
    for mode in MODES:  # warm-up, untimed
        run_mode(engine, w, inputs, mode, sampling)
    out: dict = {"frozen": [], "unfrozen": []}
    for repeat in range(repeats):
        for state in ("unfrozen", "frozen") if repeat % 2 == 0 else ("frozen", "unfrozen"):
            if state == "frozen":
                gc.freeze()
            else:
                gc.unfreeze()
            for mode in MODES:
                r = run_mode(engine, w, inputs, mode, sampling)
                out[state].append({k: r[k] for k in ("gc_full", "gc_ms", "throughput", "host_ms_per_pass")} | {"mode": mode})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="mmlu,multi_turn_chat")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--size", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--config", default=None)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--tokenizer", default=None)
    args = ap.parse_args()
    kw = {"load_format": args.load_format} | ({"tokenizer_path": args.tokenizer} if args.tokenizer else {})
    sampling = {"max_new_tokens": 8, "temperature": 0}
    print("| workload | start-up objects | full GCs / round (all modes) | GC ms / round, median (max) | host ms / pass, median |")
    print("| --- | --- | --- | --- | --- |")
    with rf.Engine(args.config, **kw) as engine:
        for name in args.workloads.split(","):
            res = rounds(engine, name, args.n, args.size, sampling, args.repeats)
            for state, rs in res.items():
                ms = [r["gc_ms"] for r in rs]
                print(f"| {name} | {state} | {sum(r['gc_full'] for r in rs) / len(rs):.2f} | "
                      f"{statistics.median(ms):.1f} ({max(ms):.0f}) | {statistics.median(r['host_ms_per_pass'] for r in rs):.1f} |",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
