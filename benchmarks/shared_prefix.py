"""Shared prefix on CPU: radix cache on vs off, same run.

64 requests share a 1,000-token prefix and have distinct 20-token suffixes; 16 output
tokens each (ignore_eos). Prints wall time for each setting and the ratio.

    .venv/bin/python benchmarks/shared_prefix.py
"""

from __future__ import annotations

import argparse
import random
import time

import torch


def workload(num: int, prefix_len: int, suffix_len: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randint(1000, 20000) for _ in range(prefix_len)]
    return [prefix + [rng.randint(1000, 20000) for _ in range(suffix_len)] for _ in range(num)]


def timed(engine, prompts, out_len: int) -> tuple[float, dict]:
    params = {"max_new_tokens": out_len, "temperature": 0, "ignore_eos": True}
    t = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    dt = time.perf_counter() - t
    cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
    return dt, {"cached_tokens": cached, "outputs": [o["output_ids"] for o in outs]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num", type=int, default=64)
    ap.add_argument("--prefix", type=int, default=1000)
    ap.add_argument("--suffix", type=int, default=20)
    ap.add_argument("--out", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(2)
    from radixflow import Engine

    prompts = workload(args.num, args.prefix, args.suffix, 0)
    results = {}
    for disable in (False, True):
        with Engine(disable_radix_cache=disable) as e:
            e.generate(input_ids=[[5, 6, 7]], sampling_params={"max_new_tokens": 2})  # warm up
            results[disable] = timed(e, prompts, args.out)
    on, off = results[False], results[True]
    assert on[1]["outputs"] == off[1]["outputs"], "radix cache changed greedy outputs"
    n_tok = args.num * args.out
    print(f"{args.num} requests x ({args.prefix} shared + {args.suffix}) tokens, {args.out} out")
    print(f"radix on   {on[0]:7.2f} s  cached_tokens={on[1]['cached_tokens']}  {n_tok / on[0]:7.1f} out tok/s")
    print(f"radix off  {off[0]:7.2f} s  cached_tokens={off[1]['cached_tokens']}  {n_tok / off[0]:7.1f} out tok/s")
    print(f"speed-up (off / on) = {off[0] / on[0]:.2f}x; greedy outputs identical")


if __name__ == "__main__":
    main()
