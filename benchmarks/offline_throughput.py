"""Offline throughput on CPU: radixflow Engine vs transformers batched generate, same run.

64 requests, input lengths U[16, 256], output lengths U[8, 128], ignore_eos, fixed seed.
transformers runs left-padded batches that each last until their longest output, as
its users must. Prints tokens/s for both and the ratio.

    .venv/bin/python benchmarks/offline_throughput.py [--num 64] [--hf-batch 16,64]

transformers runs at each batch size given; the ratio is against its fastest.
"""

from __future__ import annotations

import argparse
import random
import time

import torch


def make_workload(tokenizer, num: int, seed: int):
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num", type=int, default=64)
    ap.add_argument("--hf-batch", default="16,64", help="transformers batch sizes, comma-separated")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(2)
    from transformers import AutoModelForCausalLM

    from radixflow import Engine

    engine = Engine()
    reqs = make_workload(engine.tokenizer, args.num, args.seed)
    out_tokens = sum(n for _, n in reqs)
    engine.generate(input_ids=[[1, 2, 3]], sampling_params={"max_new_tokens": 4})  # warm up
    engine.flush_cache()
    rf_s = run_radixflow(engine, reqs)
    hf_model = AutoModelForCausalLM.from_pretrained(engine.runner.model_dir, dtype=torch.float32).eval()
    hf = {b: run_transformers(hf_model, reqs, b, pad_id=2) for b in map(int, args.hf_batch.split(","))}
    print(f"requests={len(reqs)} output_tokens={out_tokens}")
    print(f"radixflow     {rf_s:8.1f} s  {out_tokens / rf_s:8.1f} out tok/s")
    for b, hf_s in hf.items():
        print(f"transformers  {hf_s:8.1f} s  {out_tokens / hf_s:8.1f} out tok/s  (batch {b}, left-padded)")
    best = min(hf, key=hf.get)
    print(f"ratio radixflow / transformers (its fastest, batch {best}) = {hf[best] / rf_s:.2f}x")


if __name__ == "__main__":
    main()
