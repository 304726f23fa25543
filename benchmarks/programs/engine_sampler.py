"""Where the engine thread's wall time goes in a round, by sampling its stack (issue 29: graph mode's host
time on the H200). cProfile slows every call it counts, and on Python 3.12 only one profiler may be active
at a time, so threads cannot each have their own; a sampler thread instead reads the engine loop's stack
every `--interval-ms` (sys._current_frames) and counts, per workload:

- by part: the frame the scheduler step (or the loop's turn) called, e.g. form_extend_batch, _run_extend,
  _decode, on_step, wait (the loop napping);
- by function: each radixflow / torch function on the stack (inclusive) and the innermost one (own).

A sample is wall time, waits included: time in `synchronize` is the host waiting for the GPU (busy GPU),
the rest is host work. The switch interval is lowered while sampling so that the sampler gets the GIL
promptly (it needs the GIL to read the stacks).

    python benchmarks/programs/engine_sampler.py --device cuda --config benchmarks/configs/llama3-8b.json \\
        --load-format dummy --tokenizer TOK --n 64 --size 1.0 --workloads mmlu,hellaswag
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import radixflow as rf  # noqa: E402
from idle_gaps import SamplingThread  # noqa: E402
from run import run_mode  # noqa: E402
from step_timeline import add_round_args, engine_kwargs, stand_in_forward  # noqa: E402
from workloads import BY_NAME  # noqa: E402

LOOP = ("engine_stepper.py", "_loop")
PART_PARENTS = {("scheduler.py", "step"), ("engine_stepper.py", "_turn")}


def _where(code) -> tuple:
    return os.path.basename(code.co_filename), code.co_name


def _label(code) -> str:
    path = code.co_filename
    for root in ("/radixflow/", "/torch/", "/benchmarks/"):
        if root in path:
            return f"{root.strip('/')}/{path.split(root, 1)[1]}:{code.co_name}"
    return f"{os.path.basename(path)}:{code.co_name}"


class LoopSampler(SamplingThread):
    """Samples the stacks of threads running the engine loop while open."""

    def __init__(self, interval_s: float) -> None:
        super().__init__(interval_s)
        self.samples = 0
        self.parts: collections.Counter = collections.Counter()
        self.inclusive: collections.Counter = collections.Counter()
        self.own: collections.Counter = collections.Counter()

    def sample(self) -> None:
        me = threading.get_ident()
        for tid, frame in sys._current_frames().items():
            if tid != me:
                self._take(frame)

    def _take(self, frame) -> None:
        stack = []
        while frame is not None:
            stack.append(frame.f_code)
            frame = frame.f_back
        wheres = [_where(c) for c in stack]
        if LOOP not in wheres:
            return
        self.samples += 1
        self.own[_label(stack[0])] += 1
        self.inclusive.update({_label(c) for c in stack})
        for i in range(1, len(stack)):
            if wheres[i] in PART_PARENTS:
                self.parts[f"{wheres[i][1]} > {wheres[i - 1][1]}"] += 1
                break

    def table(self, counter: collections.Counter, n: int) -> str:
        rows = [f"{100 * c / max(self.samples, 1):6.1f}%  {k}" for k, c in counter.most_common(n)]
        return "\n".join(rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    add_round_args(ap, device="auto")
    ap.add_argument("--mode", default="graph", choices=("graph", "eager", "eager-noradix"))
    ap.add_argument("--rounds", type=int, default=3, help="sampled rounds a workload (after two warm-up rounds)")
    ap.add_argument("--interval-ms", type=float, default=0.5)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--stand-in-model", action="store_true", help="fixed logits (step_timeline.stand_in_forward)")
    args = ap.parse_args(argv)
    sampling = {"max_new_tokens": args.max_new_tokens, "temperature": 0}
    with rf.Engine(args.config, **engine_kwargs(args)) as engine:
        if args.stand_in_model:
            stand_in_forward(engine)
        for name in args.workloads.split(","):
            w = BY_NAME[name]
            inputs = w.inputs(random.Random(0), args.n, args.size)
            for _ in range(2):
                run_mode(engine, w, inputs, args.mode, sampling)
            walls = []
            with LoopSampler(args.interval_ms / 1000) as s:
                for _ in range(args.rounds):
                    t = time.perf_counter()
                    run_mode(engine, w, inputs, args.mode, sampling)
                    walls.append(time.perf_counter() - t)
            print(f"## {name} ({args.mode}): {args.rounds} rounds, {sum(walls):.3f} s, {s.samples} engine samples "
                  f"({1000 * sum(walls) / max(s.samples, 1):.2f} ms a sample)", flush=True)
            for title, counter in (("parts", s.parts), ("inclusive", s.inclusive), ("own", s.own)):
                print(f"\n### {title}\n{s.table(counter, args.top)}\n", flush=True)


if __name__ == "__main__":
    main()
