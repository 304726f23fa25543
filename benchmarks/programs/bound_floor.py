"""How far a run.py JSON's graph / no-radix ratio is from what the GPU's own work allows, per
workload, four ways: measured; with graph mode's host-only time zero; with both columns'
host-only time zero (GPU busy against GPU busy: the forward passes as they ran); and at the
roofline floor of each column's passes (every pass reads the weights once, every computed token
costs the linear layers' FLOPs at the chip's peak; attention and KV reads left out, which
lowers both floors). Also each column's GPU busy time over its floor, and the measured ratio
with each round's garbage collection pauses taken out.

    python benchmarks/programs/bound_floor.py benchmarks/results/h200-2026-12-02-s9-programs/session9_programs_h200.json
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass


@dataclass
class Chip:
    weight_bytes: float  # read once a pass
    bytes_per_s: float
    flops_per_token: float  # the linear layers' (2 x parameters)
    flops_per_s: float

    def floor_s(self, passes: float, tokens: float) -> float:
        """A pass cannot be shorter than its weight read or its FLOPs (the larger of the two,
        summed over the round's passes as if each pass were one or the other: a lower bound)."""
        return max(passes * self.weight_bytes / self.bytes_per_s, tokens * self.flops_per_token / self.flops_per_s)


def floor_s(chip: Chip, mode: dict) -> float:
    return sum(chip.floor_s(r["forward_steps"], r["extend_tokens"] + r["decode_tokens"]) for r in mode["runs"])


def gc_free_s(mode: dict) -> float:
    """The mode's wall time with its garbage collections' pauses taken out (they hold the GIL)."""
    return sum(r["round_s"] - r["gc_ms"] / 1000 for r in mode["runs"])


LABELS = {"measured": "measured", "no_gc": "GC pauses out", "graph_host_zero": "graph host-only zero",
          "both_host_zero": "both host-only zero", "floor": "both at the floor"}  # fmt: skip


def ratios(chip: Chip, r: dict) -> dict:
    """Per round: the modes may have run different numbers of rounds (run.py --baseline-repeats)."""
    g, x = r["graph"], r["eager-noradix"]
    ng, nx = len(g["runs"]), len(x["runs"])
    return {
        "measured": x["total_s"] / nx / (g["total_s"] / ng),
        "no_gc": gc_free_s(x) / nx / (gc_free_s(g) / ng),
        "graph_host_zero": x["total_s"] / nx / (g["total_gpu_s"] / ng),
        "both_host_zero": x["total_gpu_s"] / nx / (g["total_gpu_s"] / ng),
        "floor": floor_s(chip, x) / nx / (floor_s(chip, g) / ng),
    }


def geomean(values: list) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def report(results: dict, chip: Chip) -> str:
    lines = [
        "| workload | passes graph / no radix | GPU busy / floor graph / no radix | "
        + " | ".join(LABELS.values()) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in LABELS) + " |",
    ]
    columns: dict = {}
    for name, r in results.items():
        g, x = r["graph"], r["eager-noradix"]
        row = ratios(chip, r)
        for k, v in row.items():
            columns.setdefault(k, []).append(v)
        lines.append(
            f"| {name} | {g['forward_steps']:g} / {x['forward_steps']:g} | "
            f"{g['total_gpu_s'] / floor_s(chip, g):.2f} / {x['total_gpu_s'] / floor_s(chip, x):.2f} | "
            + " | ".join(f"{v:.2f}x" for v in row.values()) + " |"
        )  # fmt: skip
    means = ", ".join(f"{LABELS[k]} **{geomean(v):.2f}x**" for k, v in columns.items())
    return "\n".join(lines + ["", f"Geometric means over {len(results)} workloads: {means}."])


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="run.py --json output of a CUDA run")
    ap.add_argument("--weight-gb", type=float, default=16.06, help="bytes of weights a pass reads (Llama-3-8B bf16)")
    ap.add_argument("--hbm-tbs", type=float, default=4.8, help="memory bandwidth, TB/s (H200)")
    ap.add_argument("--params-b", type=float, default=8.03, help="parameters, billions (2 FLOPs each a token)")
    ap.add_argument("--tflops", type=float, default=989.0, help="dense bf16 peak, TFLOP/s (H200)")
    args = ap.parse_args(argv)
    results = json.load(open(args.json))["results"]
    missing = [k for k, r in results.items() if k != "timelines" and r["graph"].get("total_gpu_s") is None]
    if missing:
        raise SystemExit(f"no GPU busy time in {args.json} for {', '.join(missing)}: a CUDA run of run.py makes it")
    chip = Chip(args.weight_gb * 1e9, args.hbm_tbs * 1e12, 2 * args.params_b * 1e9, args.tflops * 1e12)
    out = report({k: v for k, v in results.items() if k != "timelines"}, chip)
    print(out)
    return out


if __name__ == "__main__":
    main()
