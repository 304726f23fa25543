"""Sampling cost on a GPU at the Llama-3 vocabulary (128,256), against a decode step (CUDA only):

    python3 benchmarks/gpu_sampling_bench.py --out $OUT/sampling

The issue asks for Triton sampling kernels "where torch is slow". This measures
`runtime/scheduling/sampler.sample_from` per batch size (1, 64, 256) for greedy, temperature alone,
top-k 50, top-p 0.9, both, and min-p 0.05, through the Triton kernel (kernels/sampling.py,
the default on CUDA) and through torch's sort-based path (`sample_from(..., triton=False)`),
with the kernel's mean number of draws per row; and, for torch's top-p path, each of its steps
(softmax, sort, cumsum + mask, scatter back, and the draw: `sampler._draw`'s inverse CDF with
its uniforms' host work and copy). Logits are N(0, 4^2) rows, a peaked
distribution like a trained model's. Times are medians of CUDA events around the call (host
launch time included), and the GPU's time alone (calls queued behind a sleeping kernel): with
overlap scheduling the host's part runs while the GPU computes the next step. Writes DIR/sampling_bench.json and prints a table.
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

from cuda_timing import cuda_median_s, cuda_queued_s  # noqa: E402
from radixflow.runtime.scheduling import sampler  # noqa: E402
from radixflow.runtime.sampling_params import SamplingParams  # noqa: E402

VOCAB = 128256
BATCHES = (1, 64, 256)
MODES = {
    "greedy": dict(temperature=0.0),
    "temperature": dict(temperature=0.8),
    "top_k50": dict(temperature=0.8, top_k=50),
    "top_p0.9": dict(temperature=0.8, top_p=0.9),
    "top_k50_top_p0.9": dict(temperature=0.8, top_k=50, top_p=0.9),
    "min_p0.05": dict(temperature=0.8, min_p=0.05),
}


def median_ms(fn, reps: int = 30, warmup: int = 5) -> float:
    return cuda_median_s(fn, reps, warmup) * 1e3


def fake_reqs(batch: int, params: dict) -> list:
    return [SimpleNamespace(sampling=SamplingParams(**params)) for _ in range(batch)]


def mean_rounds(logits: torch.Tensor, params: dict) -> float:
    """The kernel's mean number of draws per row (1 = every first draw accepted)."""
    from radixflow.kernels.sampling import sample_rows
    from radixflow.runtime.sampling_params import TOP_K_ALL

    sp, b = SamplingParams(**params), logits.shape[0]
    rounds = torch.zeros(b, dtype=torch.int32, device="cuda")
    sample_rows(logits.clone(), [sp.temperature] * b, [sp.top_k if sp.top_k > 0 else TOP_K_ALL] * b,
                [sp.top_p] * b, [sp.min_p] * b, rounds=rounds)
    return rounds.float().mean().item()


def steps_of_top_p(logits: torch.Tensor) -> dict:
    """ms of each torch step of the top-p path."""
    probs = torch.softmax(logits / 0.8, dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    cum = sorted_p.cumsum(dim=-1) - sorted_p
    kept = sorted_p.masked_fill(cum > 0.9, 0.0)
    full = torch.zeros_like(probs).scatter_(1, order, kept)
    b, top = logits.shape[0], logits.argmax(dim=-1, keepdim=True)
    return {
        "softmax": median_ms(lambda: torch.softmax(logits / 0.8, dim=-1)),
        "sort": median_ms(lambda: probs.sort(dim=-1, descending=True)),
        "cumsum_mask": median_ms(lambda: sorted_p.masked_fill(sorted_p.cumsum(dim=-1) - sorted_p > 0.9, 0.0)),
        "scatter": median_ms(lambda: torch.zeros_like(probs).scatter_(1, order, kept)),
        "topk1024": median_ms(lambda: probs.topk(1024, dim=-1)),
        "draw": median_ms(lambda: sampler._draw(full, sampler.draw_uniforms([None] * b, full.device), top)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    opts = ap.parse_args()
    assert torch.cuda.is_available(), "CUDA only"
    os.makedirs(opts.out, exist_ok=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    res: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "vocab": VOCAB, "ms": {}, "top_p_steps_ms": {}}
    res["rounds"], res["gpu_ms"] = {}, {}
    for b in BATCHES:
        logits = torch.randn(b, VOCAB, device="cuda", generator=gen) * 4
        res["ms"][b], res["gpu_ms"][b] = {}, {}
        for path in ("triton", "torch"):
            for name, params in MODES.items():
                call = lambda p=params, t=path == "triton": sampler.sample_from(logits.clone(), fake_reqs(b, p), triton=t)  # noqa: E731
                res["ms"][b][f"{name}/{path}"] = median_ms(call)
                res["gpu_ms"][b][f"{name}/{path}"] = cuda_queued_s(call) * 1e3
        res["ms"][b]["clone_only"] = median_ms(lambda: logits.clone())
        res["rounds"][b] = {name: mean_rounds(logits, params) for name, params in MODES.items() if params["temperature"] > 0}
        res["top_p_steps_ms"][b] = steps_of_top_p(logits)
    with open(os.path.join(opts.out, "sampling_bench.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"{res['gpu']}  torch {res['torch']}  vocab {VOCAB}; ms per call (median of 30), Triton kernel / torch path")
    print(f"{'batch':>6} " + " ".join(f"{n:>18}" for n in MODES) + "   clone_only")
    for b in BATCHES:
        print(f"{b:>6} " + " ".join(f"{res['ms'][b][n + '/triton']:8.3f}/{res['ms'][b][n + '/torch']:<9.3f}" for n in MODES)
              + f"   {res['ms'][b]['clone_only']:.3f}")
    print("GPU time alone (calls queued behind a sleeping kernel, host launch time hidden), ms:")
    for b in BATCHES:
        print(f"{b:>6} " + " ".join(f"{res['gpu_ms'][b][n + '/triton']:8.3f}/{res['gpu_ms'][b][n + '/torch']:<9.3f}" for n in MODES))
    print("kernel draws per row: " + " | ".join(f"bs{b}: " + ", ".join(f"{k} {v:.2f}" for k, v in res["rounds"][b].items())
                                                for b in BATCHES))
    print("top-p path by step (ms): " + " | ".join(
        f"bs{b}: " + ", ".join(f"{k} {v:.3f}" for k, v in res["top_p_steps_ms"][b].items()) for b in BATCHES))


if __name__ == "__main__":
    main()
