"""The extend passes of one mode, per workload: how many a round, their new tokens and requests,
and how many an extend-graph setting (--cuda-graph-extend-max-tokens / -reqs) would take. Like
pass_shapes.py it replays a GPU run's programs (programs a round, in flight: from its JSON)
through an engine here; only the passes' shapes count, so any model does, and the scheduler's
batching here can differ a little from the GPU's.

    python benchmarks/programs/extend_shapes.py benchmarks/results/h200-2026-12-02-s9-programs/session9_programs_h200.json \\
        --config benchmarks/configs/smollm2-tiny.json --load-format dummy --max-total-tokens 800000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
import radixflow as rf  # noqa: E402
from radixflow.runtime.execution.extend_static_batch import extend_buckets, pick_bucket  # noqa: E402
from radixflow.runtime.execution.forward_batch import ForwardMode  # noqa: E402
from run import MODES, run_mode  # noqa: E402
from workloads import BY_NAME  # noqa: E402


def record(engine: rf.Engine, gpu_results: dict, mode: str, size: float, sampling: dict) -> dict:
    """Per workload, (new tokens, requests, logits rows) of each extend pass of one round of `mode`."""
    shapes: list = []
    forward = engine.runner.forward

    def recording(fb):
        if fb.mode == ForwardMode.EXTEND:
            shapes.append((fb.num_tokens, fb.batch_size, fb.logits_indices.numel()))
        return forward(fb)

    engine.runner.forward = recording
    out = {}
    try:
        for name, r in gpu_results.items():
            inputs = BY_NAME[name].inputs(random.Random(0), r["programs_per_round"], size)
            shapes.clear()
            run_mode(engine, BY_NAME[name], inputs, mode, sampling, in_flight=r["in_flight"])
            out[name] = list(shapes)
    finally:
        engine.runner.forward = forward
    return out


def report(shapes: dict, limits: list) -> str:
    """One row per workload; a column per (max tokens, max requests) limit: the passes a bucket takes
    (the runner's own pick_bucket, so logits rows count as well)."""
    head = " | ".join(f"<= {t} tokens, {q} reqs" for t, q in limits)
    lines = [f"| workload | extend passes | new tokens median / max | requests median / max | {head} |",
             "| --- | --- | --- | --- |" + " --- |" * len(limits)]  # fmt: skip
    for name, s in shapes.items():
        toks, reqs = [t for t, _, _ in s] or [0], [b for _, b, _ in s] or [0]
        fits = " | ".join(str(sum(pick_bucket(extend_buckets(lt, lq), *shape) is not None for shape in s))
                          for lt, lq in limits)
        lines.append(f"| {name} | {len(s)} | {statistics.median(toks):g} / {max(toks)} | "
                     f"{statistics.median(reqs):g} / {max(reqs)} | {fits} |")  # fmt: skip
    return "\n".join(lines)


def parse_limits(text: str) -> list:
    try:
        limits = [tuple(int(v) for v in pair.split("/")) for pair in text.split(",")]
    except ValueError:
        limits = []
    if not limits or any(len(pair) != 2 for pair in limits):
        raise SystemExit(f"--limits {text!r}: TOKENS/REQS pairs, comma-separated, e.g. 256/64,2048/256")
    return limits


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gpu_json", help="a GPU run's run.py --json output (its programs a round and in flight)")
    ap.add_argument("--mode", default="graph", choices=MODES)
    ap.add_argument("--limits", default="256/64,512/64,2048/64,2048/256",
                    help="extend-graph settings to count the passes of, as TOKENS/REQS pairs")
    ap.add_argument("--size", type=float, default=None, help="scale of the shared texts (default: the GPU run's)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the GPU run's")
    ap.add_argument("--config", default=None, help="a model directory or config.json (with --load-format dummy)")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-total-tokens", type=int, default=None)
    ap.add_argument("--extend-graph-tokens", type=int, default=0,
                    help="run this engine with --cuda-graph-extend-max-tokens (a check that the padded passes run)")
    ap.add_argument("--extend-graph-reqs", type=int, default=64, help="and --cuda-graph-extend-max-reqs")
    args = ap.parse_args(argv)
    with open(args.gpu_json) as f:
        gpu = json.load(f)
    size = args.size if args.size is not None else gpu["args"]["size"]
    sampling = {"max_new_tokens": args.max_new_tokens or gpu["args"]["max_new_tokens"], "temperature": 0}
    kw = {"device": args.device, "load_format": args.load_format,
          "cuda_graph_extend_max_tokens": args.extend_graph_tokens, "cuda_graph_extend_max_reqs": args.extend_graph_reqs}
    if args.max_total_tokens:
        kw["max_total_tokens"] = args.max_total_tokens
    with rf.Engine(args.config, **kw) as engine:
        shapes = record(engine, gpu["results"], args.mode, size, sampling)
    out = report(shapes, parse_limits(args.limits))
    print(out)
    return out


if __name__ == "__main__":
    main()
