"""Does graph mode's host work grow with what an engine ran before (issue 29, session 10)? One engine,
one protocol: `all` runs run.py's three modes a round (no radix, eager, then graph), `graph` runs
graph rounds only. It reports graph mode's rounds (CPU time a program, host ms a pass) and then
counts the Python calls of one more graph round, profiled on every thread (the engine loop and the
program threads): calls do not depend on the machine's load, so two protocols' counts, diffed with
--compare, show any work that one engine's state adds.

    python benchmarks/programs/host_drift.py --protocol all --json all.json    # then --protocol graph
    python benchmarks/programs/host_drift.py --compare all.json graph.json
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import random
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
import radixflow as rf  # noqa: E402
from host_profile import ThreadProfiles  # noqa: E402
from run import MODES, run_mode  # noqa: E402
from workloads import BY_NAME  # noqa: E402


class CallCounts(ThreadProfiles):
    """cProfile on the engine loop and on each program run while installed (host_profile's patching);
    `per_function()` merges them."""

    def per_function(self) -> dict:
        """{"file:line(name)": [calls, own CPU seconds]} over every profiled thread."""
        profs = self.profiles["engine"] + self.profiles["program"]
        st = pstats.Stats(profs[0])
        for p in profs[1:]:
            st.add(p)
        out: dict = {}
        for (f, line, name), (_, nc, tt, _, _) in st.stats.items():
            c = out.setdefault(_key(f"{os.path.basename(f)}:{line}({name})"), [0, 0.0])
            c[0], c[1] = c[0] + nc, c[1] + tt
        return out


def _key(name: str) -> str:
    """A function's name without the object addresses that differ from process to process."""
    return re.sub(r" at 0x[0-9a-f]+", "", name)


def graph_rounds(engine, name: str, protocol: str, n: int, size: float, rounds: int, sampling: dict) -> dict:
    w = BY_NAME[name]
    inputs = w.inputs(random.Random(0), n, size)
    before = MODES if protocol == "all" else ("graph",)
    for mode in before:  # warm-ups
        run_mode(engine, w, inputs, mode, sampling)
    timed = []
    for _ in range(rounds):
        for mode in before[:-1] if protocol == "all" else ():
            run_mode(engine, w, inputs, mode, sampling)
        timed.append(run_mode(engine, w, inputs, "graph", sampling))
    for mode in before[:-1] if protocol == "all" else ():
        run_mode(engine, w, inputs, mode, sampling)
    counts = CallCounts(engine, w.program)
    try:
        profiled = run_mode(engine, w, inputs, "graph", sampling)
    finally:
        counts.close()
    return {
        "cpu_ms_per_program": [1000 * r["cpu_per_program"] for r in timed],
        "host_ms_per_pass": [r["host_ms_per_pass"] for r in timed],
        "round_s": [r["round_s"] for r in timed],
        "steps": [r["scheduler_steps"] for r in timed],
        "profiled_steps": profiled["scheduler_steps"],
        "calls": counts.per_function(),
    }


def compare(a_path: str, b_path: str, top: int = 15) -> str:
    """Per workload: the two protocols' medians, and the functions whose call counts differ most."""
    a, b = (json.load(open(p)) for p in (a_path, b_path))
    lines = []
    for name in a["results"]:
        ra, rb = a["results"][name], b["results"][name]
        med = {k: (statistics.median(ra[k]), statistics.median(rb[k])) for k in ("cpu_ms_per_program", "host_ms_per_pass", "round_s")}
        lines.append(f"{name}: {a['protocol']} / {b['protocol']}: " + "; ".join(f"{k} {x:.3f} / {y:.3f}" for k, (x, y) in med.items())
                     + f"; steps of the profiled round {ra['profiled_steps']} / {rb['profiled_steps']}")  # fmt: skip
        ca, cb = ({_key(f): v for f, v in r["calls"].items()} for r in (ra, rb))
        total = sum(v[0] for v in ca.values()), sum(v[0] for v in cb.values())
        lines.append(f"  calls in the profiled graph round: {total[0]} / {total[1]}")
        diff = sorted(((ca.get(f, [0])[0] - cb.get(f, [0])[0], f) for f in set(ca) | set(cb)), key=lambda d: -abs(d[0]))
        lines += [f"  {d:+8d}  {f}  ({ca.get(f, [0])[0]} / {cb.get(f, [0])[0]})" for d, f in diff[:top] if d]
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--protocol", choices=("all", "graph"), default="all")
    ap.add_argument("--workloads", default="llm_judge,react")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--size", type=float, default=0.25)
    ap.add_argument("--rounds", type=int, default=4, help="timed graph rounds (each after the other modes with `all`)")
    ap.add_argument("--config", default=None)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--extend-graph-tokens", type=int, default=None,
                    help="engine --cuda-graph-extend-max-tokens (on the CPU: the padded extend passes, without graphs)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--compare", nargs=2, metavar="JSON", help="diff two runs' JSONs instead of running")
    args = ap.parse_args(argv)
    if args.compare:
        print(compare(*args.compare))
        return
    sampling = {"max_new_tokens": 8, "temperature": 0}
    results = {}
    kw = {} if args.extend_graph_tokens is None else {"cuda_graph_extend_max_tokens": args.extend_graph_tokens}
    with rf.Engine(args.config, device="cpu", load_format=args.load_format, **kw) as engine:
        for name in args.workloads.split(","):
            results[name] = graph_rounds(engine, name, args.protocol, args.n, args.size, args.rounds, sampling)
            r = results[name]
            print(f"{name} ({args.protocol}): CPU ms a program {statistics.median(r['cpu_ms_per_program']):.2f}, host ms a pass "
                  f"{statistics.median(r['host_ms_per_pass']):.2f}, round {statistics.median(r['round_s']):.3f} s", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"protocol": args.protocol, "args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
