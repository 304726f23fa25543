"""Where one mode's host time goes: cProfile on every thread that runs radixflow's Python in a
round of run.py's workloads: the engine thread (scheduler steps, the program executor, queued
submissions) and the program threads (run_async's workers: tracing, lowering, tokenizing,
waiting, replaying). CPU time per thread (time.thread_time), so a thread waiting for the GIL or
for its requests counts nothing; the top functions by own time and by cumulative time, per
thread group. One warm-up round of the mode first, then the profiled round.

    python benchmarks/programs/host_profile.py --config benchmarks/configs/smollm2-tiny.json \\
        --load-format dummy --n 64 --size 1.0 --workloads mmlu,react --stand-in-model
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import radixflow as rf  # noqa: E402
from run import run_mode  # noqa: E402
from step_timeline import stand_in_forward  # noqa: E402
from workloads import BY_NAME  # noqa: E402


class ThreadProfiles:
    """Patches the engine stepper's loop and the program's run() so that each runs under its
    own thread's cProfile; `stats(group)` merges a group's profiles."""

    def __init__(self, engine, program) -> None:
        self.profiles: dict = {"engine": [], "program": []}
        self._lock = threading.Lock()
        self._restore = [(engine.stepper, "_loop", engine.stepper._loop)]
        engine.stepper._loop = self._wrap(engine.stepper._loop, "engine")
        program.run = self._wrap(program.run, "program")  # run_async looks self.run up per call
        self._program = program

    def _wrap(self, fn, group: str):
        def wrapped(*a, **k):
            prof = cProfile.Profile(time.thread_time)
            prof.enable()
            try:
                return fn(*a, **k)
            finally:
                prof.disable()
                with self._lock:
                    self.profiles[group].append(prof)

        return wrapped

    def close(self) -> None:
        for obj, name, fn in self._restore:
            setattr(obj, name, fn)
        del self._program.run

    def stats(self, group: str):
        profs = self.profiles[group]
        if not profs:
            return None
        st = pstats.Stats(profs[0], stream=io.StringIO())
        for p in profs[1:]:
            st.add(p)
        return st


def top(st: pstats.Stats, key: str, n: int) -> str:
    out = io.StringIO()
    st.stream = out
    st.sort_stats(key).print_stats(n)
    lines = out.getvalue().splitlines()
    start = next((i for i, l in enumerate(lines) if l.lstrip().startswith("ncalls")), 0)
    return "\n".join(lines[start:])


def area(filename: str) -> str:
    """A function's area: its radixflow module (radixflow/...), else its package's name."""
    if "/radixflow/" in filename:
        return "radixflow/" + filename.split("/radixflow/", 1)[1]
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1].split("/", 1)[0]
    return os.path.basename(filename) or filename


def by_area(st: pstats.Stats) -> list:
    """Own time per area, a builtin's (C function's) own time charged to its callers' areas:
    (seconds, area), largest first. The areas do not overlap: they sum to the thread's time."""
    out: dict = {}
    for (filename, _, name), (_, _, tt, _, callers) in st.stats.items():
        if filename != "~" or not callers:  # a C function called at the profile's top level: its own area
            key = area(filename) if filename != "~" else name
            out[key] = out.get(key, 0.0) + tt
            continue
        for (cfile, _, _), (_, _, ctt, _) in callers.items():
            out[area(cfile)] = out.get(area(cfile), 0.0) + ctt
    return sorted(((t, a) for a, t in out.items()), reverse=True)


def profile_workload(engine, name: str, mode: str, n: int, size: float, sampling: dict, n_top: int) -> dict:
    w = BY_NAME[name]
    inputs = w.inputs(random.Random(0), n, size)
    run_mode(engine, w, inputs, mode, sampling)  # warm-up
    plain = run_mode(engine, w, inputs, mode, sampling)  # unprofiled: the round's own figures
    tp = ThreadProfiles(engine, w.program)
    try:
        t = time.perf_counter()
        run_mode(engine, w, inputs, mode, sampling)
        wall = time.perf_counter() - t
    finally:
        tp.close()
    out = {"round_s": plain["round_s"], "model_s": plain["model_s"], "steps": plain["scheduler_steps"],
           "profiled_round_s": wall}  # fmt: skip
    for group in ("engine", "program"):
        st = tp.stats(group)
        out[f"{group}_cpu_s"] = 0.0 if st is None else st.total_tt
        if st is not None:
            out[f"{group}_areas"] = "\n".join(f"{t:8.3f}  {a}" for t, a in by_area(st)[:n_top])
            out[f"{group}_tottime"] = top(st, "tottime", n_top)
            out[f"{group}_cumtime"] = top(st, "cumulative", n_top)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="react,llm_judge,tree_of_thought,hellaswag,mmlu")
    ap.add_argument("--mode", default="graph", choices=("graph", "eager", "eager-noradix"))
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--size", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--top", type=int, default=25, help="functions listed per thread group and sort key")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--config", default=None)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--max-total-tokens", type=int, default=None)
    ap.add_argument("--tokenizer", default=None, help="a tokenizer folder (a --config model has none of its own)")
    ap.add_argument("--stand-in-model", action="store_true",
                    help="fixed logits instead of the forward pass (step_timeline.stand_in_forward): host time alone")
    args = ap.parse_args(argv)
    if sys.version_info >= (3, 12):  # cProfile on sys.monitoring: a second thread's enable() raises ValueError
        raise SystemExit("host_profile.py needs Python < 3.12, where each thread can have its own cProfile; "
                         "on 3.12+ use benchmarks/programs/engine_sampler.py (it samples the engine loop's stack)")
    kw = {"device": args.device, "load_format": args.load_format}
    if args.max_total_tokens:
        kw["max_total_tokens"] = args.max_total_tokens
    if args.tokenizer:
        kw["tokenizer_path"] = args.tokenizer
    sampling = {"max_new_tokens": args.max_new_tokens, "temperature": 0}
    with rf.Engine(args.config, **kw) as engine:
        if args.stand_in_model:
            stand_in_forward(engine)
        for name in args.workloads.split(","):
            r = profile_workload(engine, name, args.mode, args.n, args.size, sampling, args.top)
            print(f"## {name} ({args.mode}): round {r['round_s']:.3f} s, model {r['model_s']:.3f} s, "
                  f"{r['steps']} steps; profiled round {r['profiled_round_s']:.3f} s, CPU s engine thread "
                  f"{r['engine_cpu_s']:.3f}, program threads {r['program_cpu_s']:.3f}", flush=True)
            for group in ("engine", "program"):
                for key in ("areas", "tottime", "cumtime"):
                    if f"{group}_{key}" in r:
                        print(f"\n### {group} threads by {key}\n{r[f'{group}_{key}']}", flush=True)


if __name__ == "__main__":
    main()
