"""The roofline floor of each mode's forward passes with attention counted, from the passes'
shapes: a GPU run's JSON (run.py --json) says how many programs a round each workload ran and
how many were in flight; this replays the same programs through an engine here (any model: only
the batches' shapes are kept, through the runner's pass hook) and prices every pass on the chip
of the GPU run:

    a pass >= max((weights + KV read) / bandwidth, (linear + attention FLOPs) / peak)

where a decode row reads its whole context's KV and attends to it, and an extend request reads
its prefix's KV once and its new tokens attend to prefix and causally to themselves. Against
bound_floor.py's floor (a weight read a pass, linear FLOPs a token) this adds what attention
costs, which is what grows with the shared prefixes that the radix cache keeps. Gens run to
what this engine's model samples, so the decode passes' count can differ from the GPU run's.

    python benchmarks/programs/pass_shapes.py benchmarks/results/h200-2026-12-02-s9-programs/session9_programs_h200.json \\
        --config benchmarks/configs/smollm2-tiny.json --load-format dummy --max-total-tokens 800000 --stand-in-model
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(__file__))
import radixflow as rf  # noqa: E402
from radixflow.runtime.execution.forward_batch import ForwardMode  # noqa: E402
from bound_floor import geomean  # noqa: E402
from run import MODES, run_mode  # noqa: E402
from workloads import BY_NAME  # noqa: E402


@dataclass
class Model:
    """Llama-3-8B by default: what a pass costs beyond its tokens' linear FLOPs."""

    weight_bytes: float = 16.06e9
    linear_flops_per_token: float = 2 * 8.03e9
    kv_bytes_per_token: float = 32 * 8 * 128 * 2 * 2  # layers x KV heads x head dim x (K, V) x bf16
    attn_flops_per_pair: float = 4 * 32 * 32 * 128  # QK and PV, 2 FLOPs each, x layers x heads x head dim


@dataclass
class Chip:
    bytes_per_s: float = 4.8e12
    flops_per_s: float = 989e12


def pass_floor(model: Model, chip: Chip, decode: bool, prefix: list, new: list) -> float:
    if decode:  # each row attends to its whole context (prefix includes all but the new token)
        kv_tokens = sum(p + 1 for p in prefix)
        pairs = kv_tokens
    else:
        kv_tokens = sum(prefix)
        pairs = sum(n * p + n * (n + 1) / 2 for p, n in zip(prefix, new))
    read = (model.weight_bytes + kv_tokens * model.kv_bytes_per_token) / chip.bytes_per_s
    compute = (sum(new) * model.linear_flops_per_token + pairs * model.attn_flops_per_pair) / chip.flops_per_s
    return max(read, compute)


class ShapeRecorder:
    """Every forward pass's floor in seconds, wrapping the runner's forward (also a stand-in's)."""

    def __init__(self, engine: rf.Engine, model: Model, chip: Chip):
        self.runner, self.model, self.chip = engine.runner, model, chip
        self.floors: list = []
        self.decode_rows = 0
        self._forward = self.runner.forward
        self.runner.forward = self.record

    def record(self, fb):
        prefix, new = list(fb.prefix_lens_list), list(fb.extend_lens_list)
        if not prefix:  # a batch without the host copies
            prefix, new = fb.prefix_lens.tolist(), fb.extend_lens.tolist()
        decode = fb.mode == ForwardMode.DECODE
        self.decode_rows += len(prefix) if decode else 0
        self.floors.append(pass_floor(self.model, self.chip, decode, prefix, new))
        return self._forward(fb)

    def take(self) -> tuple:
        out, rows, self.floors, self.decode_rows = self.floors, self.decode_rows, [], 0
        return out, rows

    def close(self) -> None:
        self.runner.forward = self._forward


def replay(engine: rf.Engine, gpu_results: dict, size: float, sampling: dict, model: Model, chip: Chip) -> dict:
    rec = ShapeRecorder(engine, model, chip)
    out: dict = {}
    try:
        for name, r in gpu_results.items():
            inputs = BY_NAME[name].inputs(random.Random(0), r["programs_per_round"], size)
            out[name] = {}
            for mode in MODES:
                run_mode(engine, BY_NAME[name], inputs, mode, sampling, in_flight=r["in_flight"])
                floors, rows = rec.take()
                out[name][mode] = {"passes": len(floors), "floor_s": sum(floors), "decode_rows": rows}
            print(name, {m: round(v["floor_s"], 4) for m, v in out[name].items()}, file=sys.stderr, flush=True)
    finally:
        rec.close()
    return out


PASS_TOLERANCE = 0.10  # a replay whose pass count is further than this from the GPU run's prices other passes


def replay_matches(here: float, gpu: float) -> bool:
    return abs(here - gpu) <= PASS_TOLERANCE * gpu


def report(gpu_results: dict, floors: dict) -> str:
    """One row a workload; the geometric means leave out workloads whose replay ran a different
    number of passes than the GPU run in either column (marked "no"): their floors price other passes."""
    lines = ["| workload | passes here graph / no radix (GPU run) | replay matches | graph decode rows here (GPU run) | floor s a round graph / no radix | GPU busy / floor graph / no radix | both host-only zero (GPU run) | both at the floor |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    busy, floor, left_out = [], [], []
    for name, f in floors.items():
        g, x = gpu_results[name]["graph"], gpu_results[name]["eager-noradix"]
        gb, xb = g["total_gpu_s"] / len(g["runs"]), x["total_gpu_s"] / len(x["runs"])  # --baseline-repeats
        fg, fx = f["graph"]["floor_s"], f["eager-noradix"]["floor_s"]
        ok = replay_matches(f["graph"]["passes"], g["forward_steps"]) and replay_matches(
            f["eager-noradix"]["passes"], x["forward_steps"])
        if ok:
            busy.append(xb / gb)
            floor.append(fx / fg)
        else:
            left_out.append(name)
        lines.append(f"| {name} | {f['graph']['passes']} / {f['eager-noradix']['passes']} ({g['forward_steps']:g} / "
                     f"{x['forward_steps']:g}) | {'yes' if ok else 'no'} | {f['graph']['decode_rows']} ({g['decode_tokens']:g}) | {fg:.3f} / {fx:.3f} | {gb / fg:.2f} / {xb / fx:.2f} | {xb / gb:.2f}x | "
                     f"{fx / fg:.2f}x |")  # fmt: skip
    if not busy:
        return "\n".join(lines + ["", "No workload's replay ran the GPU run's pass counts: no geometric mean."])
    out = (f"Geometric means over the {len(busy)} workloads whose replay ran the GPU run's pass counts within "
           f"{PASS_TOLERANCE:.0%}, graph vs eager without radix cache: both host-only zero (GPU busy) "
           f"**{geomean(busy):.2f}x**; both at the floor with attention **{geomean(floor):.2f}x**.")
    if left_out:
        out += f" Left out (replay ran other passes): {', '.join(left_out)}."
    return "\n".join(lines + ["", out])


def check_gpu_json(path: str, results: dict) -> None:
    """A CPU run's JSON has no GPU busy time to compare floors with: say so, not a TypeError."""
    missing = sorted(n for n, r in results.items() if any(r[m].get("total_gpu_s") is None for m in MODES))
    if missing:
        raise SystemExit(f"{path} has no GPU busy time for {', '.join(missing)} (a CPU run?): "
                         "pass_shapes needs run.py --json from a CUDA run")


def replay_saved(args: argparse.Namespace, saved: dict, gpu: dict) -> dict:
    sampling = {"max_new_tokens": saved["args"]["max_new_tokens"], "temperature": 0}
    kw = {"load_format": args.load_format}
    if args.max_total_tokens:
        kw["max_total_tokens"] = args.max_total_tokens
    with rf.Engine(args.config, **kw) as engine:
        if args.stand_in_model:
            from step_timeline import stand_in_forward

            stand_in_forward(engine)
        return replay(engine, gpu, saved["args"]["size"], sampling, Model(), Chip())


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="run.py --json output of a CUDA run (programs a round, in flight, GPU busy time)")
    ap.add_argument("--config", default=None, help="the engine here (only its batches' shapes count)")
    ap.add_argument("--load-format", default="auto",
                    help="the engine here's weights (dummy: random, enough with --stand-in-model)")
    ap.add_argument("--max-total-tokens", type=int, default=None,
                    help="KV pool of the engine here: big enough that no round retracts (the GPU run's did not)")
    ap.add_argument("--floors", default=None,
                    help="a floors JSON written by --out: report from it without replaying")
    ap.add_argument("--workloads", default=None, help="default: every workload of the JSON")
    ap.add_argument("--out", default=None, help="also write the floors here as JSON")
    ap.add_argument("--stand-in-model", action="store_true",
                    help="fixed logits instead of the model (step_timeline.py's): no model time is spent here; gens "
                         "end where the stand-in's tokens end them, which need not be where the GPU run's "
                         "did (the report flags workloads whose pass counts differ)")
    args = ap.parse_args(argv)
    saved = json.load(open(args.json))
    gpu = {k: v for k, v in saved["results"].items() if k != "timelines"}
    if args.workloads:
        unknown = set(args.workloads.split(",")) - set(gpu)
        if unknown:
            raise SystemExit(f"not in {args.json}: {', '.join(sorted(unknown))}")
        gpu = {k: gpu[k] for k in args.workloads.split(",")}
    check_gpu_json(args.json, gpu)
    if args.floors:
        floors = {k: v for k, v in json.load(open(args.floors)).items() if k in gpu}
    else:
        floors = replay_saved(args, saved, gpu)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(floors, f, indent=1)
    out = report(gpu, floors)
    print(out)
    return out


if __name__ == "__main__":
    main()
