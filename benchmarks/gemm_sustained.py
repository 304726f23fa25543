"""Is the matmul rate a short burst's or a sustained one's? (issue 28: prefill GEMMs ran at 717 TFLOP/s in the
engine against 813 for `matmul_rate`'s 10 products.) Runs bf16 products back to back for --seconds and prints
the rate of each ~0.5 s window beside the SM clock and power nvidia-smi reports over it, then the Llama-3-8B
prefill shapes (an 8,192-token chunk) as a short burst and after the sustained run.

    python3 benchmarks/gemm_sustained.py --seconds 20 --layer-seconds 15 --json OUT/gemm_sustained.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time

import torch

SHAPES = {"square_8192": (8192, 8192, 8192), "qkv": (8192, 4096, 6144), "gate_up": (8192, 4096, 28672),
          "down": (8192, 14336, 4096), "o_proj": (8192, 4096, 4096)}  # (M, K, N)


def operands(m: int, k: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
            torch.randn(k, n, device="cuda", dtype=torch.bfloat16) * 0.02)


def rate(a: torch.Tensor, b: torch.Tensor, iters: int) -> float:
    """TFLOP/s of `iters` products timed with CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        a @ b
    end.record()
    end.synchronize()
    return 2 * a.shape[0] * a.shape[1] * b.shape[1] * iters / (start.elapsed_time(end) / 1e3) / 1e12


def burst(shapes: dict) -> dict:
    out = {}
    for name, (m, k, n) in shapes.items():
        a, b = operands(m, k, n)
        rate(a, b, 3)
        out[name] = round(rate(a, b, 10), 1)
    return out


def layer_rate(pairs: list, iters: int) -> float:
    """TFLOP/s of `iters` rounds of a prefill layer's four products (qkv, o_proj, gate_up, down) in turn."""
    flops = sum(2 * a.shape[0] * a.shape[1] * b.shape[1] for a, b in pairs) * iters
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        for a, b in pairs:
            a @ b
    end.record()
    end.synchronize()
    return flops / (start.elapsed_time(end) / 1e3) / 1e12


def sustained(seconds: float, layer: bool = False) -> tuple[list[dict], list]:
    """Windows of back-to-back products (8192^3, or with `layer` the prefill layer's four shapes in turn)
    with the SM clock, power and temperature sampled during them."""
    if layer:
        pairs = [operands(*SHAPES[n]) for n in ("qkv", "o_proj", "gate_up", "down")]
        step = lambda: layer_rate(pairs, 60)  # noqa: E731
    else:
        a, b = operands(8192, 8192, 8192)
        step = lambda: rate(a, b, 400)  # noqa: E731
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader,nounits",
                            "-lms", "250"], stdout=subprocess.PIPE, text=True)
    windows, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        windows.append({"t_s": round(time.perf_counter() - t0, 2), "tflops": round(step(), 1)})
    smi.terminate()
    samples = [line.split(", ") for line in smi.communicate()[0].strip().splitlines() if line.count(",") == 2]
    return windows, [[float(x) for x in s] for s in samples]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--layer-seconds", type=float, default=0.0, help="then as long on the prefill layer's four shapes in turn")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    result = {"burst_cold": burst(SHAPES)}
    windows, smi = sustained(args.seconds)
    result.update(sustained=windows, smi_clock_mhz_power_w_temp_c=smi, burst_after=burst(SHAPES))
    print("burst (cold):", result["burst_cold"])
    print("sustained 8192^3 windows (TFLOP/s):", [w["tflops"] for w in windows])
    if smi:
        print("SM MHz first/last:", smi[0][0], smi[-1][0], " power W first/max/last:", smi[0][1], max(s[1] for s in smi), smi[-1][1])
    print("burst (after):", result["burst_after"])
    if args.layer_seconds:
        windows, smi = sustained(args.layer_seconds, layer=True)
        result.update(layer_sustained=windows, layer_smi=smi)
        print("sustained prefill-layer windows (TFLOP/s):", [w["tflops"] for w in windows])
        if smi:
            print("SM MHz first/last:", smi[0][0], smi[-1][0], " power W max/last:", max(s[1] for s in smi), smi[-1][1])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
