"""Offline throughput on CPU: radixflow Engine vs transformers batched generate, same run.

64 requests, input lengths U[16, 256], output lengths U[8, 128], ignore_eos, fixed seed,
float32 for both (the CPU default). transformers runs left-padded batches that each last
until their longest output, as its users must, at each batch size given; a run's ratio is
against its fastest batch size in that run. With --runs N the two are measured N times,
interleaved (radixflow, then each transformers batch size), and a table gives each run's
ratio and the load average around it.

    .venv/bin/python benchmarks/offline_throughput.py --runs 3 [--num 64] [--hf-batch 16,32,64] [--ab-linear]
"""

from __future__ import annotations

import argparse
import os
import random
import time

import torch

from radixflow.kernels import cpu_linear


def make_workload(num: int, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    vocab = [i for i in range(1000, 20000)]
    reqs = []
    for _ in range(num):
        n_in, n_out = rng.randint(16, 256), rng.randint(8, 128)
        reqs.append(([rng.choice(vocab) for _ in range(n_in)], n_out))
    return reqs


def run_radixflow(engine, reqs) -> float:
    ids = [r[0] for r in reqs]
    params = [{"max_new_tokens": n, "temperature": 0, "ignore_eos": True} for _, n in reqs]
    engine.flush_cache()  # every run starts cold: no prompt is reused from the run before
    t = time.perf_counter()
    outs = engine.generate(input_ids=ids, sampling_params=params)
    dt = time.perf_counter() - t
    assert [len(o["output_ids"]) for o in outs] == [n for _, n in reqs]
    return dt


def run_transformers(model, reqs, batch: int, pad_id: int) -> float:
    t = time.perf_counter()
    for i in range(0, len(reqs), batch):
        part = reqs[i : i + batch]
        width = max(len(p) for p, _ in part)
        ids = torch.full((len(part), width), pad_id)
        mask = torch.zeros_like(ids)
        for j, (p, _) in enumerate(part):
            ids[j, width - len(p) :] = torch.tensor(p)
            mask[j, width - len(p) :] = 1
        longest = max(n for _, n in part)
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                           do_sample=False, pad_token_id=pad_id)
    return time.perf_counter() - t


def one_run(engine, hf_model, reqs, batches: list[int], ab_linear: bool) -> dict:
    """radixflow, then (--ab-linear) radixflow with torch's F.linear, then transformers at each batch size."""
    load_before = os.getloadavg()[0]
    r = {"radixflow": run_radixflow(engine, reqs), "hf": {}}
    print(f"  radixflow {r['radixflow']:.1f} s", flush=True)
    if ab_linear:
        cpu_linear.enabled = False
        r["radixflow F.linear"] = run_radixflow(engine, reqs)
        cpu_linear.enabled = True
        print(f"  radixflow with F.linear {r['radixflow F.linear']:.1f} s", flush=True)
    for b in batches:
        r["hf"][b] = run_transformers(hf_model, reqs, b, pad_id=2)
        print(f"  transformers batch {b} {r['hf'][b]:.1f} s", flush=True)
    r["load"] = (load_before, os.getloadavg()[0])
    return r


def print_table(runs: list[dict], out_tokens: int, batches: list[int]) -> None:
    ab = "radixflow F.linear" in runs[0]
    head = ["run", "radixflow s", "out tok/s"] + (["radixflow F.linear s"] if ab else [])
    head += [f"hf b{b} s" for b in batches] + ["hf best", "ratio", "load 1m"]
    print(" | ".join(head))
    for i, r in enumerate(runs, 1):
        best = min(r["hf"], key=r["hf"].get)
        cells = [str(i), f"{r['radixflow']:.1f}", f"{out_tokens / r['radixflow']:.1f}"]
        cells += [f"{r['radixflow F.linear']:.1f}"] if ab else []
        cells += [f"{r['hf'][b]:.1f}" for b in batches]
        cells += [f"b{best} {out_tokens / r['hf'][best]:.1f} tok/s", f"{r['hf'][best] / r['radixflow']:.2f}x",
                  f"{r['load'][0]:.1f}->{r['load'][1]:.1f}"]
        print(" | ".join(cells))
    ratios = [min(r["hf"].values()) / r["radixflow"] for r in runs]
    print(f"ratio radixflow / transformers' fastest batch, per run: {', '.join(f'{x:.2f}x' for x in ratios)} "
          f"(min {min(ratios):.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num", type=int, default=64)
    ap.add_argument("--hf-batch", default="16,32,64", help="transformers batch sizes, comma-separated")
    ap.add_argument("--runs", type=int, default=1, help="measure both this many times, interleaved")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ab-linear", action="store_true",
                    help="also time radixflow with torch's F.linear instead of oneDNN (kernels/cpu_linear.py)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    from transformers import AutoModelForCausalLM

    from radixflow import Engine

    engine = Engine()
    reqs = make_workload(args.num, args.seed)
    out_tokens = sum(n for _, n in reqs)
    batches = [int(b) for b in args.hf_batch.split(",")]
    hf_model = AutoModelForCausalLM.from_pretrained(engine.runner.model_dir, dtype=torch.float32).eval()
    engine.generate(input_ids=[[1, 2, 3]], sampling_params={"max_new_tokens": 4})  # warm up both
    run_transformers(hf_model, [([1, 2, 3], 4)], 1, pad_id=2)
    print(f"requests={len(reqs)} input_tokens={sum(len(p) for p, _ in reqs)} output_tokens={out_tokens} "
          f"float32, torch threads {torch.get_num_threads()}, {os.cpu_count()} CPUs", flush=True)
    runs = []
    for i in range(args.runs):
        print(f"run {i + 1}", flush=True)
        runs.append(one_run(engine, hf_model, reqs, batches, args.ab_linear))
    print_table(runs, out_tokens, batches)


if __name__ == "__main__":
    main()
