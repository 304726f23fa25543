"""Per-thread CPU time of graph rounds, unprofiled (session 11, issue 29): the engine thread (the
stepper's loop: scheduler steps, the program executor, the waiters' checks) and the program
threads (run_async's workers), each by time.thread_time, so time spent waiting for the GIL or for
requests counts nothing; and each round's wall time, the stand-in model's time and its steps.
Tiny config with the stand-in model (fixed logits), as step_timeline.py --stand-in-model; the
same script runs against any tree (base or new) from that tree's root:

    PYTHONPATH=$PWD python <this file> --json out.json [--rounds 5] [--workloads a,b]

(The JSON here came from a first version that copied ThreadProfiles' wrapping instead of subclassing it: the same.)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks/programs"))
import radixflow as rf  # noqa: E402
from host_profile import ThreadProfiles  # noqa: E402
from pass_timer import Timeline  # noqa: E402
from run import run_mode  # noqa: E402
from step_timeline import stand_in_forward  # noqa: E402
from workloads import BY_NAME  # noqa: E402

ALL = "mmlu,hellaswag,react,generative_agents,tree_of_thought,skeleton_of_thought,llm_judge,json_decode,multi_turn_chat,dspy_rag"


class ThreadCpu(ThreadProfiles):
    """host_profile's patching of the stepper's loop and the program's run(), adding up
    time.thread_time over each call per group instead of profiling."""

    def __init__(self, engine, program) -> None:
        self.cpu = {"engine": 0.0, "program": 0.0}
        super().__init__(engine, program)

    def _wrap(self, fn, group: str):
        def wrapped(*a, **k):
            t = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                with self._lock:
                    self.cpu[group] += time.thread_time() - t

        return wrapped


def rounds(engine, name: str, n: int, size: float, count: int, sampling: dict) -> list:
    w = BY_NAME[name]
    inputs = w.inputs(random.Random(0), n, size)
    run_mode(engine, w, inputs, "graph", sampling)  # warm-up
    out = []
    for _ in range(count):
        tc, tl = ThreadCpu(engine, w.program), Timeline(engine)
        try:
            t = time.perf_counter()
            run_mode(engine, w, inputs, "graph", sampling)
            wall = time.perf_counter() - t
        finally:
            tc.close()
            tl.close()
        out.append({"wall_s": wall, "model_s": tl.model_s, "steps": tl.steps, "engine_cpu_s": tc.cpu["engine"],
                    "program_cpu_s": tc.cpu["program"]})  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default=ALL)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--size", type=float, default=1.0)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    sampling = {"max_new_tokens": 8, "temperature": 0}
    result = {"load_start": os.getloadavg(), "workloads": {}}
    with rf.Engine("benchmarks/configs/smollm2-tiny.json", load_format="dummy", max_total_tokens=800000) as engine:
        stand_in_forward(engine)
        for name in args.workloads.split(","):
            rs = rounds(engine, name, args.n, args.size, args.rounds, sampling)
            med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            result["workloads"][name] = {"rounds": rs, "median": med}
            print(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in med.items()), flush=True)
    result["load_end"] = os.getloadavg()
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
