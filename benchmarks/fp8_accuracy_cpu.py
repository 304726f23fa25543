"""Where FP8's accuracy loss on the default model comes from, on the CPU in float32 (no GPU needed):

    python benchmarks/fp8_accuracy_cpu.py --prompts 16 --out /tmp/fp8acc.json

The default model (SmolLM2-135M-Instruct, transformers, float32) is the reference. Each variant
changes only how the linear layers' weights (q/k/v/o, gate/up/down) are stored or how their inputs
are rounded, the rest stays float32: bf16 weights (the yardstick: what bf16 storage alone costs),
e4m3 weights with one scale per output channel (what `--quantization fp8` stores, as
`reference.quantize_rows_torch` does it), that plus per-token e4m3 activations (the FP8 GEMM's
inputs at more than 8 rows), and e4m3 with one scale per 128-column block of each row (finer
scales, not shipped: how much of the loss per-channel scaling causes).

Teacher-forced over gpu_real_model.py's prompts, one forward each (generation is too slow on the
shared 2-core machine): at every position, the reference's top token, its |dlogprob| between the
reference and the variant (mean, p99), and how often the variant's top token is the same.
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
def position_logprobs(model, prompts: list[dict]) -> list[torch.Tensor]:
    """Each prompt's log-softmax at every position, [T, vocab]."""
    return [torch.log_softmax(model(torch.tensor([p["ids"]])).logits[0].float(), dim=-1) for p in prompts]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
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
    ref = position_logprobs(model, prompts)
    top = [r.argmax(dim=-1) for r in ref]
    results = {"prompts": len(prompts), "positions": sum(len(p["ids"]) for p in prompts),
               "reference_s": round(time.perf_counter() - t, 1)}
    for name in a.variants.split(","):
        convert, acts = VARIANTS[name]
        hooks = []
        for m, w in zip(linears(model), originals):
            m.weight.data = convert(w)
            if acts:
                hooks.append(m.register_forward_pre_hook(lambda mod, args: (quantize_tokens(args[0]),)))
        t = time.perf_counter()
        got = position_logprobs(model, prompts)
        diff = torch.cat([(g.gather(1, i[:, None]) - r.gather(1, i[:, None]))[:, 0].abs() for g, r, i in zip(got, ref, top)])
        same = torch.cat([g.argmax(dim=-1) == i for g, i in zip(got, top)]).float().mean().item()
        results[name] = {"mean_abs_dlogprob": round(diff.mean().item(), 5), "p99_abs_dlogprob": round(diff.quantile(0.99).item(), 4),
                         "max_abs_dlogprob": round(diff.max().item(), 4), "top1_same": round(same, 4),
                         "s": round(time.perf_counter() - t, 1)}
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
