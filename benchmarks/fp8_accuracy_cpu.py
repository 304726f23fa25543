"""Where FP8's accuracy loss on the default model comes from, on the CPU in float32 (no GPU needed):

    python benchmarks/fp8_accuracy_cpu.py --prompts 32 --max-new-tokens 64 --out /tmp/fp8acc.json

The default model (SmolLM2-135M-Instruct, transformers, float32) is the reference. Each variant
changes only how the linear layers' weights (q/k/v/o, gate/up/down) are stored or how their inputs
are rounded, the rest stays float32: bf16 weights (the yardstick: what bf16 storage alone costs),
e4m3 weights with one scale per output channel (what `--quantization fp8` stores, as
`reference.quantize_rows_torch` does it), that plus per-token e4m3 activations (the FP8 GEMM's
inputs at more than 8 rows), and e4m3 with one scale per 128-column block of each row (finer
scales, not shipped: how much of the loss per-channel scaling causes). The prompts are
gpu_real_model.py's. Per variant: greedy continuations identical to the reference's, and the mean
and p99 |dlogprob| of the reference's greedy tokens, teacher-forced through both.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from radixflow.kernels.reference import FP8, FP8_MAX, quantize_rows_torch  # noqa: E402

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def fp8_channel(w: torch.Tensor) -> torch.Tensor:
    q, s = quantize_rows_torch(w)
    return q.float() * s[:, None]


def fp8_block(w: torch.Tensor, block: int = 128) -> torch.Tensor:
    n, k = w.shape
    q, s = quantize_rows_torch(w.reshape(n * k // block, block))
    return (q.float() * s[:, None]).reshape(n, k)


def quantize_tokens(x: torch.Tensor) -> torch.Tensor:
    """Per-token e4m3 rounding of a linear layer's input, as kernels/fp8.py's quantize_rows does it."""
    s = (x.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp(min=1e-12)
    return (x / s).clamp(-FP8_MAX, FP8_MAX).to(FP8).float() * s


VARIANTS = {
    "bf16_weights": (lambda w: w.to(torch.bfloat16).float(), False),
    "fp8_channel_weights": (fp8_channel, False),
    "fp8_channel_weights_token_acts": (fp8_channel, True),
    "fp8_block128_weights": (fp8_block, False),
}


def linears(model):
    return [m for name, m in model.named_modules() if name.split(".")[-1] in LINEARS]


@torch.inference_mode()
def greedy(model, prompts: list[dict], n: int) -> list[list[int]]:
    out = []
    for p in prompts:
        ids = torch.tensor([p["ids"]])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
        out.append(gen[0, len(p["ids"]):].tolist())
    return out


@torch.inference_mode()
def token_logprobs(model, prompts: list[dict], outs: list[list[int]]) -> list[torch.Tensor]:
    res = []
    for p, o in zip(prompts, outs):
        ids = torch.tensor([p["ids"] + o])
        logits = model(ids).logits[0, len(p["ids"]) - 1: -1].float()
        res.append(torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(o)[:, None])[:, 0])
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.manual_seed(0)
    from gpu_real_model import encode_prompts
    from transformers import AutoModelForCausalLM

    from radixflow.model_files import convert_gguf, default_gguf_path

    folder = convert_gguf(default_gguf_path())
    prompts = encode_prompts(folder, a.prompts)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    originals = [m.weight.data.clone() for m in linears(model)]
    t = time.perf_counter()
    ref_ids = greedy(model, prompts, a.max_new_tokens)
    ref_lp = token_logprobs(model, prompts, ref_ids)
    results = {"prompts": len(prompts), "max_new_tokens": a.max_new_tokens, "reference_s": round(time.perf_counter() - t, 1)}
    for name in a.variants.split(","):
        convert, acts = VARIANTS[name]
        hooks = []
        for m, w in zip(linears(model), originals):
            m.weight.data = convert(w)
            if acts:
                hooks.append(m.register_forward_pre_hook(lambda mod, args: (quantize_tokens(args[0]),)))
        t = time.perf_counter()
        ids = greedy(model, prompts, a.max_new_tokens)
        diff = torch.cat([(x - y).abs() for x, y in zip(token_logprobs(model, prompts, ref_ids), ref_lp)])
        results[name] = {"identical": sum(x == y for x, y in zip(ids, ref_ids)),
                         "mean_abs_dlogprob": round(diff.mean().item(), 5),
                         "p99_abs_dlogprob": round(diff.quantile(0.99).item(), 4),
                         "max_abs_dlogprob": round(diff.max().item(), 4), "s": round(time.perf_counter() - t, 1)}
        print(name, results[name], flush=True)
        for h in hooks:
            h.remove()
        for m, w in zip(linears(model), originals):
            m.weight.data = w
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
