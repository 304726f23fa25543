"""The Triton extend attention kernel on the program workloads' pass shapes (Llama-3-8B heads: 32 query,
8 KV, 128 wide; bf16; one layer; CUDA only): many requests with a few new tokens after a shared cached
prefix (a select's choices, a program's next segment), and a long chunk for contrast. Each case is first
checked against the torch reference on its first requests, then timed over 20 calls with CUDA events.
Run it in two source trees (PYTHONPATH) to compare kernels:

    python benchmarks/extend_attn_shapes.py [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json

import torch

# name: (requests, new tokens each, prefix tokens, prefix shared by all requests)
CASES = {
    "hellaswag choices": (512, 8, 1050, True),
    "mmlu questions": (256, 75, 1900, True),
    "next segments": (128, 40, 600, True),
    "one token each": (64, 1, 1500, False),
    "long chunks": (4, 1024, 1000, False),
}
HQ, HKV, D = 32, 8, 128


def make_case(n: int, ext: int, pre: int, shared: bool, device: str = "cuda", dtype=torch.bfloat16):
    total = (1 if shared else n) * pre + n * ext + 16
    k = torch.randn(total, HKV, D, device=device, dtype=dtype)
    v = torch.randn(total, HKV, D, device=device, dtype=dtype)
    perm = torch.randperm(total - 1, device=device) + 1
    table = torch.zeros(n + 1, pre + ext, dtype=torch.int32, device=device)
    at = 0
    if shared:
        table[1:, :pre] = perm[:pre].int()
        at = pre
    for b in range(n):
        if not shared:
            table[b + 1, :pre] = perm[at : at + pre].int()
            at += pre
        table[b + 1, pre:] = perm[at : at + ext].int()
        at += ext
    q = torch.randn(n * ext, HQ, D, device=device, dtype=dtype)
    idx = torch.arange(1, n + 1, device=device)
    pre_t = torch.full((n,), pre, device=device)
    ext_t = torch.full((n,), ext, device=device)
    starts = torch.arange(n, device=device) * ext
    return q, k, v, table, idx, pre_t, ext_t, starts


def check(case, ext: int, reqs: int = 4) -> float:
    from radixflow.kernels import reference as ref
    from radixflow.kernels.extend_attention import extend_attention

    q, k, v, table, idx, pre, ext_t, starts = case
    rows = reqs * ext
    got = extend_attention(q[:rows], k, v, table, idx[:reqs], pre[:reqs], ext_t[:reqs], starts[:reqs], ext, D**-0.5)
    want = ref.extend_attention_ref(q[:rows].float(), k.float(), v.float(), table, idx[:reqs], pre[:reqs],
                                    ext_t[:reqs], D**-0.5)
    return (got.float() - want).abs().max().item()


def time_us(case, ext: int, iters: int = 20) -> float:
    from radixflow.kernels.extend_attention import extend_attention

    q, k, v, table, idx, pre, ext_t, starts = case
    out = torch.empty_like(q)
    for _ in range(3):
        extend_attention(q, k, v, table, idx, pre, ext_t, starts, ext, D**-0.5, out=out)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        extend_attention(q, k, v, table, idx, pre, ext_t, starts, ext, D**-0.5, out=out)
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / iters * 1000


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    rows = {}
    print("| case | requests x new tokens, prefix | max abs error vs reference | us a call |\n| --- | --- | --- | --- |")
    for name, (n, ext, pre, shared) in CASES.items():
        case = make_case(n, ext, pre, shared)
        err, us = check(case, ext), time_us(case, ext)
        rows[name] = {"requests": n, "new": ext, "prefix": pre, "shared": shared, "max_abs_err": err, "us": us}
        print(f"| {name} | {n} x {ext}, {pre}{' shared' if shared else ''} | {err:.2e} | {us:.1f} |", flush=True)
        assert err < 2e-2, f"{name}: the kernel is off the reference by {err}"
        del case
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
