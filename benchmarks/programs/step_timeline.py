"""Where a workload's wall time goes, graph vs eager: the engine thread's time inside scheduler
steps, inside the program executor (request graphs' per-step work), and idle between turns
(waiting for program threads to hand it work), per mode, one interleaved round after a
full-size warm-up of each (with --syncs, then one more graph round, untimed, listing where the host waited
for the GPU: probe_logs.SyncLog; with --profile-forward, one more listing the host's work inside the forward
calls by cProfile); and the model's own time: on CUDA the GPU time of the forward passes
(events around each, read after the round), on CPU the wall time inside them. "Host ms / pass"
is the rest of the wall time per pass: what the host adds to the model's work; the phase
columns split the engine thread's part of it (pass_timer.PHASES; on CUDA each forward pass is
waited for first, so the phases hold no GPU time). Same engine arguments as run.py.

    python benchmarks/programs/step_timeline.py --workloads mmlu,generative_agents --n 16 --size 0.15
    python3 benchmarks/programs/step_timeline.py --device cuda --config benchmarks/configs/llama3-8b.json \\
        --load-format dummy --tokenizer .gpu_assets/tokenizer --n 64 --size 1.0
    python benchmarks/programs/step_timeline.py --config benchmarks/configs/smollm2-tiny.json --load-format dummy \\
        --n 64 --size 1.0 --workloads hellaswag --stand-in-model --max-total-tokens 800000   # host time alone
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import radixflow as rf  # noqa: E402
from run import run_mode  # noqa: E402
from pass_timer import PHASES, Timeline  # noqa: E402
from probe_logs import SyncLog  # noqa: E402
from workloads import BY_NAME  # noqa: E402


def timeline(engine, name: str, n: int, size: float, sampling: dict) -> dict:
    w = BY_NAME[name]
    inputs = w.inputs(random.Random(0), n, size)
    for mode in ("graph", "eager"):  # warm-up, untimed
        run_mode(engine, w, inputs, mode, sampling)
    tl = Timeline(engine, phases=True)
    out = {}
    try:
        for mode in ("graph", "eager"):
            tl.reset()
            t = time.perf_counter()
            run_mode(engine, w, inputs, mode, sampling)
            wall = time.perf_counter() - t
            model = tl.model_seconds()
            out[mode] = {"wall_s": wall, "step_s": tl.step_s, "executor_s": tl.executor_s, "steps": tl.steps,
                         "idle_s": wall - tl.step_s - tl.executor_s, "model_s": model,
                         "host_ms_per_pass": 1000 * (wall - model) / max(tl.steps, 1),
                         "phase_ms_per_pass": {k: 1000 * v / max(tl.steps, 1) for k, v in tl.phase_s.items()}}  # fmt: skip
    finally:
        tl.close()
    return out


def sync_sites(engine, name: str, n: int, size: float, sampling: dict) -> dict:
    """One graph round under SyncLog: the host's synchronizing CUDA calls and its waits on CUDA events not
    yet complete, by the radixflow line that made them (the round is already warm)."""
    w = BY_NAME[name]
    with SyncLog(str(engine.runner.device).startswith("cuda")) as log:
        run_mode(engine, w, w.inputs(random.Random(0), n, size), "graph", sampling)
    return log.summary()


def forward_profile(engine, name: str, n: int, size: float, sampling: dict, n_top: int = 30) -> str:
    """One graph round with cProfile on inside the runner's forward calls only (the host's launch of each
    pass, its table flush and batch set-up): the top functions by cumulative time."""
    import cProfile
    import io
    import pstats

    w, runner, prof = BY_NAME[name], engine.runner, cProfile.Profile()
    forward = runner.forward

    def profiled(fb):
        prof.enable()
        try:
            return forward(fb)
        finally:
            prof.disable()

    runner.forward = profiled
    try:
        run_mode(engine, w, w.inputs(random.Random(0), n, size), "graph", sampling)
    finally:
        runner.forward = forward
    out = io.StringIO()
    for key in ("cumulative", "tottime"):  # where the time goes, then which calls spend it themselves
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(n_top)
    return out.getvalue()


def stand_in_forward(engine, token: int = 1000) -> None:
    """Replace the model's forward pass by fixed logits (`token` first on every row): the
    scheduler, the radix cache, the executor and the callers run as usual (gens run to their
    length, a select takes its first choice), so a round's wall time is the host's work."""
    import torch

    row = torch.zeros(1, engine.runner.vocab_size, device=engine.runner.device)
    row[0, token] = 1.0
    engine.runner.forward = lambda fb: row.repeat(fb.logits_indices.numel(), 1)  # the sampler writes into its rows


def print_rows(name: str, result: dict) -> None:
    print("| workload | mode | wall s | in steps s | in executor s | idle s | model s | steps | host ms / pass | "
          + " | ".join(f"{p} ms / pass" for p in PHASES) + " |\n" + "| --- " * (9 + len(PHASES)) + "|")
    for mode, r in result.items():
        phases = " | ".join(f"{r.get('phase_ms_per_pass', {}).get(p, 0.0):.1f}" for p in PHASES)
        print(f"| {name} | {mode} | {r['wall_s']:.3f} | {r['step_s']:.3f} | {r['executor_s']:.3f} | "
              f"{r['idle_s']:.3f} | {r['model_s']:.3f} | {r['steps']} | {r['host_ms_per_pass']:.1f} | {phases} |", flush=True)  # fmt: skip


def add_round_args(ap, device: str) -> None:
    """The arguments of the one-round-a-workload probes (idle_gaps, mixed_pass_probe): which workloads, how
    many programs in flight and how large (as run.py), the rounds' size, the engine's (engine_kwargs), --json."""
    from workloads import BY_NAME

    ap.add_argument("--workloads", default=",".join(BY_NAME))
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--size", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--min-round-s", type=float, default=0.5, help="as run.py: rounds of k waves of n programs")
    ap.add_argument("--device", default=device)
    ap.add_argument("--config", default=None)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--max-total-tokens", type=int, default=None)
    ap.add_argument("--json", default=None)


def engine_kwargs(args) -> dict:
    """The Engine's arguments from a tool's --device, --load-format, --tokenizer and --max-total-tokens."""
    kw = {"device": args.device, "load_format": args.load_format}
    if args.tokenizer:
        kw["tokenizer_path"] = args.tokenizer
    if args.max_total_tokens:
        kw["max_total_tokens"] = args.max_total_tokens
    return kw


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="mmlu,hellaswag,generative_agents")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--size", type=float, default=0.15)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--config", default=None)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--max-total-tokens", type=int, default=None, help="KV pool size in tokens (e.g. a GPU's, to time the host's work with a pool that large)")
    ap.add_argument("--syncs", action="store_true", help="then one graph round listing where the host waited for the GPU")
    ap.add_argument("--profile-forward", action="store_true", help="then one graph round under cProfile inside the forward calls")
    ap.add_argument("--stand-in-model", action="store_true",
                    help="the forward pass returns fixed logits (one token always first) and computes nothing: "
                         "a round's time is the host's alone")
    args = ap.parse_args(argv)
    kw = engine_kwargs(args)
    sampling = {"max_new_tokens": args.max_new_tokens, "temperature": 0}
    results = {}
    with rf.Engine(args.config, **kw) as engine:
        if args.stand_in_model:
            stand_in_forward(engine)
        for name in args.workloads.split(","):
            results[name] = timeline(engine, name, args.n, args.size, sampling)
            print_rows(name, results[name])
            if args.syncs:
                results[name]["graph_syncs"] = sync_sites(engine, name, args.n, args.size, sampling)
                print(json.dumps(results[name]["graph_syncs"], indent=1), flush=True)
            if args.profile_forward:
                print(forward_profile(engine, name, args.n, args.size, sampling), flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
