"""Graph-mode rounds with the stand-in model (the round is host work): wall and host-only time a
program, and the CPU time of the engine thread (rf-engine*) and of run_async's program threads
(rf-program*), read per thread from the kernel (no profiler). After a warm-up round, rounds
alternate between the warm-up's inputs ("same") and fresh inputs of another seed ("fresh": a
program template keyed on a non-text argument, such as hellaswag's endings, is new there).
Runs on whichever radixflow tree is first on PYTHONPATH (base and new alike).

    PYTHONPATH=$PWD python benchmarks/results/cpu-2026-12-02-s11-progthreads/thread_cpu.py \
        --workloads llm_judge,mmlu --rounds 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks", "programs"))
import radixflow as rf  # noqa: E402
from run import run_mode  # noqa: E402
from step_timeline import stand_in_forward  # noqa: E402
from workloads import BY_NAME  # noqa: E402


def cpu_by_group() -> dict:
    out = {"engine": 0.0, "program": 0.0}
    for t in threading.enumerate():
        group = "engine" if t.name.startswith("rf-engine") else "program" if t.name.startswith("rf-program") else None
        if group and t.ident is not None:
            try:
                out[group] += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except OSError:  # ended meanwhile
                pass
    return out


def one_round(engine, w, inputs: list, sampling: dict) -> dict:
    before, cpu = cpu_by_group(), time.process_time()
    r = run_mode(engine, w, inputs, "graph", sampling)
    after = cpu_by_group()
    n = len(inputs)
    return {"round_s": r["round_s"], "host_ms_per_program": 1000 * (r["round_s"] - r["model_s"]) / n,
            "engine_cpu_s": after["engine"] - before["engine"], "program_cpu_s": after["program"] - before["program"],
            "process_cpu_s": time.process_time() - cpu, "steps": r["scheduler_steps"], "load": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="react,llm_judge,tree_of_thought,hellaswag,mmlu,dspy_rag")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--size", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=2, help="pairs of rounds (same, fresh) after the warm-up")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    sampling = {"max_new_tokens": 8, "temperature": 0}
    out: dict = {}
    with rf.Engine("benchmarks/configs/smollm2-tiny.json", load_format="dummy", max_total_tokens=800000) as engine:
        stand_in_forward(engine)
        for name in args.workloads.split(","):
            w = BY_NAME[name]
            same = w.inputs(random.Random(0), args.n, args.size)
            run_mode(engine, w, same, "graph", sampling)  # warm-up
            rows = []
            for k in range(args.rounds):
                for kind in ("same", "fresh"):
                    inputs = same if kind == "same" else w.inputs(random.Random(1000 + k), args.n, args.size)
                    rows.append({"kind": kind, **one_round(engine, w, inputs, sampling)})
                    r = rows[-1]
                    print(f"{name} {kind}: round {r['round_s']:.3f} s, host {r['host_ms_per_program']:.2f} ms/program, "
                          f"CPU s engine {r['engine_cpu_s']:.3f} program threads {r['program_cpu_s']:.3f}, "
                          f"load {r['load']:.1f}", flush=True)  # fmt: skip
            out[name] = rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
