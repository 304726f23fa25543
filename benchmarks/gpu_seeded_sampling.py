"""Seeded rows on CUDA: the same token in any batch, and what they cost in the sampling kernel.

    python3 benchmarks/gpu_seeded_sampling.py --out $OUT/seeded_sampling.json

Checks, at the default model's vocabulary (49,152) and Llama 3's (128,256), on N(0, 4^2) logits:
a batch of 174 rows (every other one seeded, each seeded row its own seed and output position)
gives each seeded row the token it gets alone and in a reversed batch, and the same again on a
second run. Then times `sampler.sample_from` at temperature 1 for the batch all seeded and all
unseeded through the Triton kernel, and all seeded through torch's path
(`triton=False`, the same-run baseline): medians of CUDA events around the call, host time included.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cuda_timing import cuda_median_s  # noqa: E402
from radixflow.runtime.sampling_params import SamplingParams  # noqa: E402
from radixflow.runtime.scheduling.sampler import sample_from  # noqa: E402

BATCH = 174


def req(seed: int | None, position: int, **params) -> SimpleNamespace:
    sp = SamplingParams(**{"temperature": 1.0, **params}, sampling_seed=seed)
    return SimpleNamespace(sampling=sp, origin_input_ids=[0], kv_len=1 + position)


def invariance(vocab: int, params: dict) -> dict:
    """Seeded rows' tokens alone, in the batch, in the batch reversed, and in a second run."""
    logits = torch.randn(BATCH, vocab, device="cuda") * 4
    reqs = [req(i if i % 2 else None, 3 * i, **params) for i in range(BATCH)]
    batch = sample_from(logits.clone(), reqs).tolist()
    again = sample_from(logits.clone(), reqs).tolist()
    rev = sample_from(logits.flip(0).contiguous(), reqs[::-1]).tolist()[::-1]
    seeded = [i for i in range(BATCH) if i % 2]
    alone = {i: sample_from(logits[i : i + 1].clone(), [reqs[i]]).item() for i in seeded}
    same = sum(batch[i] == again[i] == rev[i] == alone[i] for i in seeded)
    return {"vocab": vocab, "params": params, "seeded_rows": len(seeded), "same_everywhere": same,
            "distinct_tokens": len({batch[i] for i in seeded})}


def timings(vocab: int) -> dict:
    logits = torch.randn(BATCH, vocab, device="cuda") * 4
    seeded = [req(i, 5) for i in range(BATCH)]
    plain = [req(None, 5) for _ in range(BATCH)]
    out = {}
    for name, reqs, triton in (("kernel_seeded", seeded, True), ("kernel_unseeded", plain, True),
                               ("torch_seeded", seeded, False)):
        call = lambda r=reqs, t=triton: sample_from(logits.clone(), r, triton=t)  # noqa: E731
        out[name + "_ms"] = 1e3 * cuda_median_s(call, reps=30, warmup=3)
    out["torch_over_kernel_seeded"] = out["torch_seeded_ms"] / out["kernel_seeded_ms"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "CUDA only"
    torch.manual_seed(0)
    result = {"device": torch.cuda.get_device_name(), "batch": BATCH, "invariance": [], "timings": {}}
    for vocab in (49152, 128256):
        for params in ({}, {"top_p": 0.9}, {"top_k": 50, "min_p": 0.01}):
            row = invariance(vocab, params)
            result["invariance"].append(row)
            print(f"vocab {vocab} {params}: {row['same_everywhere']} of {row['seeded_rows']} seeded rows the same "
                  f"alone / batched / reversed / again ({row['distinct_tokens']} distinct tokens)", flush=True)
        result["timings"][vocab] = timings(vocab)
        print(f"vocab {vocab}, batch {BATCH}, temperature 1: {result['timings'][vocab]}", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
