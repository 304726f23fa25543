"""Decode attention launches for Nsight Compute to profile, at the 1,000 in / 1,000 out workload's shape:

    ncu --clock-control none --kernel-name regex:_decode_stage1 --launch-skip 2 --launch-count 1 --set full \\
        python3 benchmarks/ncu_decode_attn.py --pool fp8 [--batch 1000 --len 1500] [--config '{"fp8": {...}}']

Llama-3-8B heads (gpu_attn_bench's inputs: KV slots a random permutation of the pool), the FP8 pool with one scale
per KV head (fp8_attn_bench.fp8_pool_dequantized) or the bf16 pool, DECODE_CONFIG as it stands unless --config overrides it.
Runs the launch 4 times (the first compiles), checks it against the float32 reference and prints the bytes of the
pool it reads and its time from CUDA events, so the profile's figures can be set against both.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gpu_attn_bench as attn  # noqa: E402
from fp8_attn_bench import fp8_pool_dequantized  # noqa: E402
from radixflow.kernels import reference as ref  # noqa: E402
from radixflow.kernels.decode_attention import decode_attention, num_kv_splits  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pool", choices=("fp8", "bf16"), default="fp8")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--len", type=int, default=1500, help="tokens of context per request")
    ap.add_argument("--config", default=None, help="JSON: DECODE_CONFIG keys to override")
    args = ap.parse_args()
    cfg = json.loads(args.config) if args.config else None
    lens = [args.len] * args.batch
    x = attn.make_inputs(lens)
    fp8 = args.pool == "fp8"
    kv, scales, deq = fp8_pool_dequantized(x) if fp8 else ((x["k"], x["v"]), None, [x["k"].float(), x["v"].float()])
    splits = num_kv_splits(args.batch, attn.KV_HEADS, torch.cuda.get_device_properties(0).multi_processor_count,
                           config=cfg, pool=args.pool, head_dim=attn.HEAD_DIM)

    def run():
        return decode_attention(x["q"], *kv, x["table"], x["idx"][0], x["lens"], attn.SCALE, splits, config=cfg,
                                scales=scales)

    out = run()
    want = ref.decode_attention_ref(x["q"].float(), *deq, x["table"], x["idx"][0], x["lens"], attn.SCALE)
    err = (out.float() - want).abs().max().item()
    del deq, want
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        run()
    end.record()
    torch.cuda.synchronize()
    us = start.elapsed_time(end) * 1e3 / 3
    nbytes = attn.kv_bytes(lens) // (2 if fp8 else 1)
    print(f"pool {args.pool} batch {args.batch} len {args.len} splits {splits} launch "
          f"{attn.launch_label(args.batch, cfg, args.pool)} max abs err {err:.4f} {us:.1f} us "
          f"{nbytes / 1e9:.2f} GB {nbytes / us / 1e6:.2f} TB/s", flush=True)
    assert err <= attn.TOL, err


if __name__ == "__main__":
    main()
