"""What reusing every branch's KV at a concatenating join would change (docs/programs.md,
"Concatenate-and-append reuses the first branch's KV only").

After `forks.join("concate_and_append")` the sequence is parent + branch 0 + branch 1. Branch
0's KV is exact where it is (same tokens before it, same positions); branch 1's was computed
right after the parent, at branch 0's positions and without branch 0 in its context. This
script measures, with transformers on the default model, how the next tokens change when
branch 1's KV is reused as it was computed (SGLang's parallel encoding) instead of recomputed:
the KL divergence of the next-token distribution after the continuation prompt, whether the
greedy token agrees, and whether the greedy continuation is the same.

    python benchmarks/programs/concat_kv_reuse.py [--cases 16] [--tokens 12]
"""

from __future__ import annotations

import argparse
import random
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from radixflow.runtime.execution.model_loader import resolve_model

NAMES = ["Ada", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lia", "Max", "Nia", "Oz", "Pia"]
MORNING = ["woke early and made tea", "ran along the river", "read the morning paper", "fed the cats", "went to the market"]
EVENING = ["cooked dinner for friends", "played the piano", "wrote a long letter", "watched the stars", "fixed the old bike"]


def forward(model, ids: list, cache=None, start: int = 0):
    pos = torch.arange(start, start + len(ids)).unsqueeze(0)
    return model(torch.tensor([ids]), past_key_values=cache, position_ids=pos, use_cache=True)


def joined_cache(model, parent: list, b0: list, b1: list) -> DynamicCache:
    """KV of parent + b0 (exact) followed by b1's KV as computed right after the parent."""
    first = forward(model, parent + b0).past_key_values
    second = forward(model, parent + b1).past_key_values
    n = len(parent)
    layers = [
        (torch.cat([a.keys, b.keys[:, :, n:]], dim=2), torch.cat([a.values, b.values[:, :, n:]], dim=2))
        for a, b in zip(first.layers, second.layers)
    ]
    return DynamicCache(layers)


def greedy(model, logits: torch.Tensor, cache, start: int, n: int) -> list:
    out = []
    for _ in range(n):
        tok = int(logits[0, -1].argmax())
        out.append(tok)
        r = forward(model, [tok], cache, start)
        logits, cache, start = r.logits, r.past_key_values, start + 1
    return out


def case(model, tok, rng: random.Random, n_tokens: int) -> dict:
    name = rng.choice(NAMES)
    parent = tok.encode(f"A short story about {name}.\n")
    b0 = tok.encode(f"Morning: {name} {rng.choice(MORNING)}.\n", add_special_tokens=False)
    b1 = tok.encode(f"Evening: {name} {rng.choice(EVENING)}.\n", add_special_tokens=False)
    cont = tok.encode("The end:", add_special_tokens=False)
    whole = parent + b0 + b1
    exact = forward(model, whole + cont)
    reused = forward(model, cont, joined_cache(model, parent, b0, b1), start=len(whole))
    p, q = exact.logits[0, -1].log_softmax(-1), reused.logits[0, -1].log_softmax(-1)
    return {
        "kl": float((p.exp() * (p - q)).sum()),
        "top1": int(p.argmax()) == int(q.argmax()),
        "same_text": greedy(model, exact.logits, exact.past_key_values, len(whole + cont), n_tokens)
        == greedy(model, reused.logits, reused.past_key_values, len(whole + cont), n_tokens),
        "branch1_tokens": len(b1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=12, help="greedy continuation length compared")
    args = ap.parse_args()
    path = resolve_model(None).path
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rng = random.Random(0)
    with torch.inference_mode():
        rows = [case(model, tok, rng, args.tokens) for _ in range(args.cases)]
    kls = sorted(r["kl"] for r in rows)
    print(f"{len(rows)} joins, branch 1 of {min(r['branch1_tokens'] for r in rows)}-{max(r['branch1_tokens'] for r in rows)} tokens")
    print(f"KL(exact || reused) of the next token: median {kls[len(kls) // 2]:.3f}, max {kls[-1]:.3f}")
    print(f"greedy next token the same: {sum(r['top1'] for r in rows)}/{len(rows)}")
    print(f"greedy {args.tokens}-token continuation the same: {sum(r['same_text'] for r in rows)}/{len(rows)}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
