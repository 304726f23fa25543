"""Does the FP8 decode attention run slower between FP8 GEMMs than alone? The 1,000 in / 1,000 out decode step's
kernels, one GPU, Llama-3-8B shape:

    python3 benchmarks/attn_in_step.py [--batch 1000 --len 1500 --seconds 3] [--out DIR]

Three CUDA graphs of 32 layers each, every one replayed back to back for --seconds (long enough for the power
limit's clock to settle): `attention` (the decode attention over an FP8 pool, DECODE_CONFIG's launch),
`gemms` (a layer's four FP8 products, qkv / o / gate_up / down, torch._scaled_mm with per-row scales at
`batch` rows) and `step` (the two interleaved as a decode step does: qkv, attention, o, gate_up, down).
Prints each graph's steady replay time (median of the second half of its replays) and what attention costs
inside the step (step - gemms) against attention alone. Read the SM clock with nvidia-smi beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gpu_attn_bench as attn  # noqa: E402
from fp8_attn_bench import fp8_pool_dequantized  # noqa: E402
from radixflow.kernels.decode_attention import decode_attention, num_kv_splits  # noqa: E402
from radixflow.kernels.settings import DEFAULT_KERNEL_SETTINGS  # noqa: E402

LAYERS = 32
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}  # (N, K)


def fp8_operands(rows: int) -> dict:
    """Per shape: activations (rows x K, e4m3, per-row scales) and a weight (N x K, e4m3, per-channel scales)."""
    ops = {}
    for name, (n, k) in SHAPES.items():
        a = (torch.randn(rows, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
        w = (torch.randn(n, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
        ops[name] = (a, w, torch.rand(rows, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5)
    return ops


def gemm(op: tuple) -> torch.Tensor:
    a, w, sa, sw = op
    return torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sw, out_dtype=torch.bfloat16,
                            use_fast_accum=DEFAULT_KERNEL_SETTINGS.fp8_fast_accum)  # as the FP8 linear accumulates


def capture(fn) -> torch.cuda.CUDAGraph:
    for _ in range(2):  # compile and warm outside the capture
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def steady_ms(g: torch.cuda.CUDAGraph, seconds: float) -> dict:
    """Replays `g` back to back for `seconds`, one event pair each: the median of the second half's times."""
    times, t_end = [], time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(10)]
        for s, e in pairs:
            s.record()
            g.replay()
            e.record()
        torch.cuda.synchronize()
        times += [s.elapsed_time(e) for s, e in pairs]
    half = times[len(times) // 2:]
    return {"replays": len(times), "first_ms": times[0], "median_ms": statistics.median(half), "min_ms": min(half)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--len", type=int, default=1500)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--layout", choices=("random", "contiguous"), default="random",
                    help="KV slots: a random permutation of the pool's (gpu_attn_bench), or each request's in order")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lens = [args.len] * args.batch
    x = attn.make_inputs(lens)
    if args.layout == "contiguous":  # as a prefilled request's slots lie in the engine's pool
        used = x["table"] > 0
        x["table"][used] = torch.arange(1, int(used.sum()) + 1, device="cuda", dtype=torch.int32)
    kv, scales, deq = fp8_pool_dequantized(x)
    del deq
    x.pop("k"), x.pop("v")
    torch.cuda.empty_cache()
    splits = num_kv_splits(args.batch, attn.KV_HEADS, torch.cuda.get_device_properties(0).multi_processor_count,
                           pool="fp8", head_dim=attn.HEAD_DIM)
    ops = fp8_operands(args.batch)

    def attention():
        return decode_attention(x["q"], *kv, x["table"], x["idx"][0], x["lens"], attn.SCALE, splits, scales=scales)

    def attention_layers():
        for _ in range(LAYERS):
            attention()

    def gemm_layers():
        for _ in range(LAYERS):
            for name in SHAPES:
                gemm(ops[name])

    def step_layers():
        for _ in range(LAYERS):
            gemm(ops["qkv"])
            attention()
            for name in ("o", "gate_up", "down"):
                gemm(ops[name])

    graphs = {"attention": capture(attention_layers), "gemms": capture(gemm_layers), "step": capture(step_layers)}
    res = {"batch": args.batch, "len": args.len, "splits": splits, "layout": args.layout,
           "launch": attn.launch_label(args.batch, None, "fp8")}
    for rnd in range(2):
        for name, g in graphs.items():
            res[f"{name}_{rnd}"] = steady_ms(g, args.seconds)
            print(f"round {rnd} {name:9s} {res[f'{name}_{rnd}']}", flush=True)
    nbytes = attn.kv_bytes(lens) // 2 * LAYERS
    flops = 2 * args.batch * sum(n * k for n, k in SHAPES.values()) * LAYERS
    for rnd in range(2):
        a, gm, st = (res[f"{n}_{rnd}"]["median_ms"] for n in ("attention", "gemms", "step"))
        inside = st - gm
        print(f"round {rnd}: attention alone {a:.2f} ms ({nbytes / a / 1e9:.2f} TB/s), gemms alone {gm:.2f} ms "
              f"({flops / gm / 1e9:.0f} TFLOP/s), step {st:.2f} ms; attention inside the step {inside:.2f} ms "
              f"({nbytes / inside / 1e9:.2f} TB/s), {inside / a:.3f}x alone", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"attn_in_step_{args.layout}.json"), "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
