"""Graph mode (auto) against eager on run.py's workloads, with auto's one-model-call rule on
(`Function.one_call_eagerly`, commit 67410f6; withdrawn in 54fb6c7, so on later trees both settings
run the request graph) and off (the request graph, as on main), in ONE engine:
run.py's run_workload (warm-ups, min_round_s waves, graph / eager rounds interleaved, order
swapped each round) once per setting per workload, the settings' order alternating by workload.
Run from the tree's root:

    python3 one_call_ab.py --device cuda --config benchmarks/configs/llama3-8b.json --load-format dummy \
        --tokenizer T --workloads mmlu,hellaswag,json_decode,generative_agents --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks", "programs"))
import radixflow as rf  # noqa: E402
from radixflow.lang.function import Function  # noqa: E402
from run import run_workload  # noqa: E402
from workloads import BY_NAME  # noqa: E402


def summary(r: dict) -> dict:
    out = {"programs_per_round": r["programs_per_round"], "waves": r["waves"], "graph_vs_eager": r["graph_vs_eager"]}
    for m in ("graph", "eager"):
        x = r[m]
        rounds = len(x["runs"])
        gpu = x["total_gpu_s"]
        out[m] = {"mode": x["mode"], "programs_s": x["throughput"], "round_s": x["total_s"] / rounds,
                  "gpu_s": None if gpu is None else gpu / rounds,
                  "host_only_s": None if gpu is None else (x["total_s"] - gpu) / rounds,
                  "cpu_ms_per_program": 1000 * x["cpu_per_program"], "steps": x["forward_steps"],
                  "host_ms_per_pass": x["host_ms_per_pass"], "p50_s": x["p50"], "gc_ms": x["gc_ms"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="mmlu,hellaswag,json_decode,generative_agents")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--config", default=None)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--max-total-tokens", type=int, default=None)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--size", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--min-round-s", type=float, default=0.5)
    ap.add_argument("--deadline-s", type=float, default=None)
    ap.add_argument("--timeline", default="", help="then these workloads' step timelines (step_timeline.py), rule off")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    kw = {"device": args.device, "load_format": args.load_format}
    if args.tokenizer:
        kw["tokenizer_path"] = args.tokenizer
    if args.max_total_tokens:
        kw["max_total_tokens"] = args.max_total_tokens
    sampling = {"max_new_tokens": 8, "temperature": 0}
    results: dict = {}
    with rf.Engine(args.config, **kw) as engine:
        deadline = None if args.deadline_s is None else time.time() + args.deadline_s
        for i, name in enumerate(args.workloads.split(",")):
            for on in ((False, True) if i % 2 == 0 else (True, False)):
                if deadline is not None and time.time() > deadline:
                    print(f"{name} rule {'on' if on else 'off'}: skipped (deadline)", flush=True)
                    continue
                Function.one_call_eagerly = on
                t = time.perf_counter()
                r = summary(run_workload(engine, BY_NAME[name], args.n, args.size, sampling, 0, args.repeats,
                                         args.min_round_s, modes=("graph", "eager")))  # fmt: skip
                results.setdefault(name, {})["on" if on else "off"] = r
                g, e = r["graph"], r["eager"]
                host = "" if g["host_only_s"] is None else f", host-only s a round {g['host_only_s']:.3f} / {e['host_only_s']:.3f}"
                print(f"{name} rule {'on ' if on else 'off'} ({time.perf_counter() - t:.0f} s, {r['programs_per_round']} a round): "
                      f"graph ({g['mode']}) {g['programs_s']:.1f} / eager {e['programs_s']:.1f} programs/s = "
                      f"{g['programs_s'] / e['programs_s']:.3f}x (rounds {', '.join(f'{v:.3f}' for v in r['graph_vs_eager'])})"
                      f"{host}, CPU ms a program {g['cpu_ms_per_program']:.2f} / {e['cpu_ms_per_program']:.2f}, "
                      f"host ms a pass {g['host_ms_per_pass']:.2f} / {e['host_ms_per_pass']:.2f}", flush=True)  # fmt: skip
                save(args, results)
        Function.one_call_eagerly = False
        for name in filter(None, args.timeline.split(",")):
            from step_timeline import print_rows, timeline

            results.setdefault("timelines", {})[name] = timeline(engine, name, args.n, args.size, sampling)
            print_rows(name, results["timelines"][name])
            save(args, results)


def save(args, results: dict) -> None:
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
