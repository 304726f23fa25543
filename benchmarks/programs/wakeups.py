"""Context switches and forward passes per round, graph vs eager: how often the process's threads
sleep and wake (from getrusage around each round), which a shared machine's load changes far less
than wall time, and the passes, which it does not change at all. Run it once per source tree
(PYTHONPATH) to compare two versions.

    python benchmarks/programs/wakeups.py --config tiny/config.json --load-format dummy \\
        --tokenizer .gpu_assets/tokenizer --workloads mmlu,skeleton_of_thought --n 64 --size 1.0
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys

sys.path.insert(0, os.path.dirname(__file__))
import radixflow as rf  # noqa: E402
from run import run_mode  # noqa: E402
from workloads import BY_NAME  # noqa: E402


def rounds(engine, name: str, n: int, size: float, sampling: dict, repeats: int) -> dict:
    w = BY_NAME[name]
    inputs = w.inputs(random.Random(0), n, size)
    for mode in ("graph", "eager"):  # warm-up, untimed
        run_mode(engine, w, inputs, mode, sampling)
    out = {}
    for mode in ("graph", "eager"):
        out[mode] = []
        for _ in range(repeats):
            before = resource.getrusage(resource.RUSAGE_SELF)
            passes = run_mode(engine, w, inputs, mode, sampling)["forward_steps"]
            after = resource.getrusage(resource.RUSAGE_SELF)
            out[mode].append({"voluntary": after.ru_nvcsw - before.ru_nvcsw,
                              "involuntary": after.ru_nivcsw - before.ru_nivcsw, "passes": passes})  # fmt: skip
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="mmlu,generative_agents,skeleton_of_thought")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--size", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--config", default=None)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--tokenizer", default=None)
    args = ap.parse_args(argv)
    kw = {"load_format": args.load_format, **({"tokenizer_path": args.tokenizer} if args.tokenizer else {})}
    sampling = {"max_new_tokens": args.max_new_tokens, "temperature": 0}
    print("| workload | mode | voluntary switches per round | involuntary | forward passes |\n| --- | --- | --- | --- | --- |")
    with rf.Engine(args.config, **kw) as engine:
        for name in args.workloads.split(","):
            for mode, rs in rounds(engine, name, args.n, args.size, sampling, args.repeats).items():
                col = lambda k: ", ".join(str(r[k]) for r in rs)  # noqa: E731
                print(f"| {name} | {mode} | {col('voluntary')} | {col('involuntary')} | {col('passes')} |", flush=True)


if __name__ == "__main__":
    main()
