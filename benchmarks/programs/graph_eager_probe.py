"""Why graph mode trails eager on some workloads (issue 29: mmlu 0.90x, json_decode and generative_agents
0.98x on the H200 in session 10, with the extend CUDA graphs on). One engine per --settings entry, one after
another in this process (the default is `default,0,default`: extend graphs on, off, and on again in an engine
that is not the process's first, which separates the graphs from first-engine effects), each running every
workload's graph and eager rounds interleaved (their order swapped every round) after untimed warm-ups, and
printing per mode:

- programs/s, host ms a pass (the round's wall time not covered by a forward pass's GPU time, over its scheduler
  steps, as run.py), GPU busy ms a pass (CUDA events around each forward pass), CPU ms a round (all threads: a
  host that spins on a GPU sync burns it);
- passes by kind (decode; extend in an extend graph's bucket; extend run eagerly) with their GPU ms, extend-graph
  replays, and first replays (a bucket's graph launched for the first time in this engine);
- host ms inside the forward calls and between them (the scheduler's and executor's own work);
- in one extra round per mode, untimed: the host's synchronizations with the GPU, counted by
  torch.cuda.set_sync_debug_mode("warn") and attributed to the radixflow line that asked, and the waits on CUDA
  events that had not completed (the scheduler's read-backs), with the ms waited; pinned host allocations
  (torch.cuda.host_memory_stats) over the timed rounds where torch has them.

A setting followed by "+feed" (e.g. `default+feed`) runs its engine with the old overlapped feeding of a request
graph's last-segment prompt, a token a decode pass (before overlap.feeds_only), for a before / after in one call.

Then, in each engine with extend graphs, what a bucket's graph costs on its first launch against its second
(the upload of an instantiated graph happens at its first launch unless uploaded ahead), on buckets that no
round used, and the first rounds' passes one by one (shape, bucket, first replay, host and GPU ms).

    python3 benchmarks/programs/graph_eager_probe.py --device cuda --config benchmarks/configs/llama3-8b.json \\
        --load-format dummy --tokenizer .gpu_assets/tokenizer --max-total-tokens 400000 --json probe.json
    python benchmarks/programs/graph_eager_probe.py --smoke     # CPU: padded passes without graphs, no syncs
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import radixflow as rf  # noqa: E402
from radixflow.runtime.scheduling import overlap  # noqa: E402
from probe_logs import PassLog, SyncLog, host_alloc_stats, scheduler_counters  # noqa: E402
from probe_passes import first_replays, mixed_costs  # noqa: E402
from run import run_mode  # noqa: E402
from workloads import BY_NAME  # noqa: E402

MODES = ("graph", "eager")
SETTINGS = "default,0,default"  # extend graphs on, off, on again in an engine that is not the process's first


def summarize(rounds: list, n: int) -> dict:
    """One mode's timed rounds: medians and per-round means."""
    def med(key):
        vals = sorted(r[key] for r in rounds)
        return vals[len(vals) // 2]

    kinds: dict = {}
    for r in rounds:
        for p in r["passes"]:
            k = kinds.setdefault(p["kind"], {"passes": 0, "gpu_ms": 0.0, "tokens": 0, "rows_of_one": 0})
            k["passes"] += 1
            k["gpu_ms"] += p["gpu_ms"]
            k["tokens"] += p["tokens"]
            k["rows_of_one"] += p["rows_of_one"]
    per = len(rounds)
    return {
        "programs_per_s": per / sum(1 / r["throughput"] for r in rounds),
        "round_s": med("round_s"), "host_ms_per_pass": med("host_ms_per_pass"),
        "gpu_ms_per_pass": med("gpu_ms_per_pass"), "cpu_ms_per_round": med("cpu_ms"),
        "passes": med("forward_steps"), "steps": med("scheduler_steps"),
        "replays_per_round": sum(r["replays"] for r in rounds) / per,
        "first_replays": sum(r["first_replays"] for r in rounds),
        "call_ms_per_round": med("call_ms"), "gap_ms_per_round": med("gap_ms"),
        "lead_ms_per_round": med("lead_ms"), "tail_ms_per_round": med("tail_ms"),
        "by_kind_per_round": {k: {f: round(v / per, 3) for f, v in d.items()} for k, d in kinds.items()},
        "host_alloc": {k: sum(r["host_alloc"].get(k, 0) for r in rounds) for k in rounds[0]["host_alloc"]},
        "scheduler_per_round": {k: sum(r["scheduler"][k] for r in rounds) / per for k in rounds[0]["scheduler"]},
        "runs": [{k: v for k, v in r.items() if k != "passes"} for r in rounds],
        "first_round_passes": rounds[0]["passes"],
    }  # fmt: skip


@contextlib.contextmanager
def feeding_continuations(on: bool):
    """With `on` (a setting's "+feed"), overlapped decode feeds a request graph's last-segment prompt a token a pass,
    as before overlap.feeds_only: the same call's before and after."""
    feeds_only = overlap.feeds_only
    if on:
        overlap.feeds_only = lambda reqs, pending: False
    try:
        yield
    finally:
        overlap.feeds_only = feeds_only


def timed_round(engine, log: PassLog, workload, inputs: list, mode: str, sampling: dict) -> dict:
    before, counters = host_alloc_stats(), scheduler_counters(engine)
    t = time.perf_counter()
    r = run_mode(engine, workload, inputs, mode, sampling)
    end = time.perf_counter()
    after = host_alloc_stats()
    passes = log.take()
    lead_ms = 1000 * (passes[0]["start"] - t) if passes else 0.0  # submitting, tracing, tokenizing, admitting
    tail_ms = 1000 * (end - passes[-1]["end"]) if passes else 0.0  # the last read-back, the programs' returns
    for p in passes:
        p.pop("start"), p.pop("end")
    r.update({
        "passes": passes, "cpu_ms": 1000 * r["cpu_per_program"] * len(inputs),
        "gpu_ms_per_pass": 1000 * r["model_s"] / max(r["forward_steps"], 1),
        "replays": sum(p["bucket"] is not None for p in passes),
        "first_replays": sum(p["first_replay"] for p in passes),
        "call_ms": sum(p["call_ms"] for p in passes), "gap_ms": sum(p["gap_ms"] or 0.0 for p in passes),
        "lead_ms": lead_ms, "tail_ms": tail_ms,
        "host_alloc": {k: after[k] - before.get(k, 0) for k in after},
        "scheduler": {k: v - counters.get(k, 0) for k, v in scheduler_counters(engine).items()},
    })  # fmt: skip
    return r


def probe_workload(engine, name: str, n: int, size: float, rounds: int, sampling: dict, seen: set) -> dict:
    w = BY_NAME[name]
    inputs = w.inputs(random.Random(0), n, size)
    log = PassLog(engine, seen)  # from the warm-ups on, so that `seen` holds the buckets they replayed
    runs: dict = {m: [] for m in MODES}
    try:
        for mode in MODES * 2:  # warm-ups: first uses of this workload's shapes (and the process's first run_async)
            run_mode(engine, w, inputs, mode, sampling)
        engine.freeze_gc()
        log.take()
        for i in range(rounds):
            for mode in MODES if i % 2 == 0 else MODES[::-1]:
                runs[mode].append(timed_round(engine, log, w, inputs, mode, sampling))
        syncs = {}
        for mode in MODES:  # untimed: the debug mode's warnings cost host time
            with SyncLog(log.cuda) as sl:
                run_mode(engine, w, inputs, mode, sampling)
            log.take()
            syncs[mode] = sl.summary()
    finally:
        log.close()
    out = {m: summarize(runs[m], n) for m in MODES}
    out["graph_vs_eager"] = [g["throughput"] / e["throughput"] for g, e in zip(runs["graph"], runs["eager"])]
    out["syncs"] = syncs
    return out


def run_setting(args, setting: str, sampling: dict, deadline: float) -> dict:
    kw = {"device": args.device, "load_format": args.load_format}
    if args.tokenizer:
        kw["tokenizer_path"] = args.tokenizer
    if args.max_total_tokens:
        kw["max_total_tokens"] = args.max_total_tokens
    if args.overlap_schedule:
        kw["overlap_schedule"] = args.overlap_schedule
    tokens, _, old = setting.partition("+")
    if tokens != "default":
        kw["cuda_graph_extend_max_tokens"] = int(tokens)
    t = time.perf_counter()
    out: dict = {"setting": setting, "workloads": {}}
    with rf.Engine(args.config, **kw) as engine, feeding_continuations(old == "feed"):
        out["start_s"] = time.perf_counter() - t
        graphs = engine.runner.extend_graphs
        out["extend_graphs"] = None if graphs is None else {"buckets": len(graphs.buckets), "graphs": graphs.use_graphs}
        seen: set = set()
        for name in args.workloads.split(","):
            if time.time() > deadline:
                print(f"{setting} {name}: skipped (past --deadline-s)", file=sys.stderr, flush=True)
                continue
            out["workloads"][name] = probe_workload(engine, name, args.n, args.size, args.rounds, sampling, seen)
            print_workload(setting, name, out["workloads"][name])
        out["first_replays"] = first_replays(engine, seen) if time.time() < deadline else []
        out["mixed_costs"] = mixed_costs(engine, **MIXED_SMOKE if args.smoke else {}) if time.time() < deadline else []
        print_mixed(setting, out["mixed_costs"])
        for r in out["first_replays"]:
            print(f"{setting}: bucket {r['bucket']} first launch: call {r['first']['call_ms']:.2f} ms, wall "
                  f"{r['first']['wall_ms']:.2f}, GPU {r['first']['gpu_ms']:.2f}; second: call "
                  f"{r['second']['call_ms']:.2f}, wall {r['second']['wall_ms']:.2f}, GPU {r['second']['gpu_ms']:.2f}",
                  flush=True)  # fmt: skip
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


MIXED_SMOKE = {"rows": 4, "continuing": (1, 4), "new": 4, "prefix": 16, "reps": 2}


def print_mixed(setting: str, rows: list) -> None:
    if not rows:
        return
    print(f"\nA decode step with continuing rows, extend graphs {setting} (ms; split: an extend pass of the continuing "
          "rows, then a decode pass of the rest)")
    print("| rows | continuing x new tokens | prefix | bucket | one mixed pass | mixed, eager | split | decode of all rows |")
    print("| --- " * 8 + "|")
    for r in rows:
        print(f"| {r['rows']} | {r['continuing']} x {r['new']} | {r['prefix']} | {r['bucket']} | {r['mixed_ms']:.2f} | "
              f"{r['mixed_eager_ms']:.2f} | {r['split_ms']:.2f} | {r['decode_all_ms']:.2f} |")  # fmt: skip
    sys.stdout.flush()


def print_workload(setting: str, name: str, r: dict) -> None:
    ge = r["graph_vs_eager"]
    print(f"\n{name}, extend graphs {setting}: graph / eager {sorted(ge)[len(ge) // 2]:.3f}x "
          f"(rounds {', '.join(f'{x:.3f}' for x in ge)})")
    print("| mode | programs/s | round s | host ms / pass | GPU ms / pass | CPU ms / round | passes | steps | replays / round "
          "| first replays | ms before the first pass / in forward calls / between passes / after the last | "
          "by kind: passes, GPU ms / round | pinned allocs |")
    print("| --- " * 13 + "|")
    for mode in MODES:
        m = r[mode]
        kinds = "; ".join(f"{k} {d['passes']:g}, {d['gpu_ms']:.1f}" for k, d in sorted(m["by_kind_per_round"].items()))
        alloc = ", ".join(f"{k} {v:g}" for k, v in m["host_alloc"].items() if v) or "-"
        print(f"| {mode} | {m['programs_per_s']:.2f} | {m['round_s']:.4f} | {m['host_ms_per_pass']:.2f} | "
              f"{m['gpu_ms_per_pass']:.2f} | {m['cpu_ms_per_round']:.1f} | {m['passes']:g} | {m['steps']:g} | "
              f"{m['replays_per_round']:.1f} | {m['first_replays']} | {m['lead_ms_per_round']:.1f} / "
              f"{m['call_ms_per_round']:.1f} / {m['gap_ms_per_round']:.1f} / {m['tail_ms_per_round']:.1f} | {kinds} | "
              f"{alloc} |")  # fmt: skip
    for mode in MODES:
        counters = {k: round(v, 1) for k, v in r[mode]["scheduler_per_round"].items() if v}
        print(f"{mode} scheduler counters a round: {counters}")
        s = r["syncs"][mode]
        print(f"{mode} syncs (one untimed round): {s['syncs'] or 'none'}; event waits: {s['event_waits'] or 'none'} "
              f"(ms {s['event_wait_ms'] or '-'})")
        first = [(p["kind"], p["tokens"], p["reqs"], p["bucket"], "first" if p["first_replay"] else "",
                  round(p["call_ms"], 2), round(p["gap_ms"] or 0, 2), round(p["gpu_ms"], 2))
                 for p in r[mode]["first_round_passes"][:12]]  # fmt: skip
        print(f"{mode} first round's passes (kind, tokens, reqs, bucket, first replay, call ms, gap ms, GPU ms): {first}")
    sys.stdout.flush()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="mmlu,json_decode")
    ap.add_argument("--settings", default=SETTINGS,
                    help="--cuda-graph-extend-max-tokens of each engine, in order ('default': the engine's own); "
                         "'+feed' after one: feed a request graph's last-segment prompt a token a pass (the old way)")
    ap.add_argument("--n", type=int, default=64, help="programs a round, all in flight")
    ap.add_argument("--size", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=4, help="timed rounds of each mode")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--deadline-s", type=float, default=120.0,
                    help="start no engine, workload or timed pass section after this many seconds")
    ap.add_argument("--smoke", action="store_true", help="2 programs, tiny sizes, 1 round (settings 0,48 by default)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--config", default=None)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--max-total-tokens", type=int, default=None)
    ap.add_argument("--overlap-schedule", default=None, choices=("auto", "on", "off"),
                    help="the engine's --overlap-schedule (default: its own; 'on' schedules a CPU run as a GPU's)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.smoke:  # padded passes (48) against unpadded ones, unless --settings says otherwise
        args.n, args.size, args.rounds, args.max_new_tokens = 2, 0.05, 1, 2
        args.settings = "0,48" if args.settings == SETTINGS else args.settings
    deadline = time.time() + args.deadline_s
    sampling = {"max_new_tokens": args.max_new_tokens, "temperature": 0}
    results = {"args": vars(args), "engines": []}
    for setting in args.settings.split(","):
        if time.time() > deadline:
            print(f"engine {setting}: skipped (past --deadline-s)", file=sys.stderr, flush=True)
            continue
        results["engines"].append(run_setting(args, setting, sampling, deadline))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1, default=str)
    return results


if __name__ == "__main__":
    main()
