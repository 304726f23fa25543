"""Decode passes a row takes under overlap with outlines' jumps after sampled tokens cutting the sampled token
back (re-tokenizing it) or not, on the CPU.

Under overlap the pass after a sampled token is launched on that token before the host sees it; a jump that
re-tokenizes it cuts it back, so that pass is wasted and the row takes a pass more. Above
--jump-forward-max-batch outlines rows now jump only by appending ("append"); "cut" is the old rule (every
jump, as in small batches); "none" takes no jump after a sampled token (llguidance's rows there). The tiny
model (dummy weights, overlap on) or, with --trained, the default model (SmolLM2-135M-Instruct); the default
model's tokenizer, constrained_gpu.py's regex or schema, outlines backend, limit 0 (every batch is "large").
Per arm and batch (--seeds: other prompts and sampling seeds): output tokens and decode passes a row (mean), the batch's decode passes, tokens a pass, valid outputs.

    python benchmarks/jump_steps_cpu.py --kind regex --rows 64 --temps 0,1 --seeds 4 [--trained]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from constrained_gpu import grammar_params, make_engine, prompts, valid  # noqa: E402

from radixflow.constrained.matcher import GrammarMatcher  # noqa: E402
from radixflow.runtime.scheduling import overlap, scheduler  # noqa: E402


def count_passes(passes: Counter, launched: list):
    """launch_decode, counting each row's decode passes (by request id) and the batch's."""
    real = overlap.launch_decode

    def counted(sched, reqs, ids=None):
        passes.update(r.rid for r in reqs)
        launched.append(len(reqs))
        return real(sched, reqs, ids)

    return real, counted


def run(eng, kind: str, temp: float, rows: int, arm: str, seed: int) -> dict:
    sched = eng.scheduler
    real_apply = sched._apply_jump_forward
    if arm == "cut":  # the old rule: outlines rows re-tokenize in any batch
        sched._apply_jump_forward = lambda req, allowed=True, limit=None, cut=True: real_apply(req, allowed, limit, True)
    GrammarMatcher.jumps_in_any_batch = arm != "none"
    passes, launched = Counter(), []
    real, counted = count_passes(passes, launched)
    overlap.launch_decode = scheduler.launch_decode = counted
    try:
        params = [dict(grammar_params(kind, temp), sampling_seed=seed * rows + i) for i in range(rows)]
        outs = eng.generate(prompts(rows * (seed + 1))[seed * rows :], params)
    finally:
        overlap.launch_decode = scheduler.launch_decode = real
        GrammarMatcher.jumps_in_any_batch = True
        sched.__dict__.pop("_apply_jump_forward", None)
    tokens = [o["meta_info"]["completion_tokens"] for o in outs]
    per_row = list(passes.values())
    return {"arm": arm, "kind": kind, "T": temp, "seed": seed, "rows": rows, "tokens_row": round(statistics.mean(tokens), 2),
            "passes_row": round(statistics.mean(per_row), 2), "batch_passes": len(launched),
            "tokens_per_pass": round(sum(tokens) / max(sum(per_row), 1), 3), "chars_row": round(statistics.mean(len(o["text"]) for o in outs), 1),
            "jumped": sum(o["meta_info"].get("jump_forward_tokens", 0) for o in outs), "valid": sum(valid(kind, o["text"]) for o in outs)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=("regex", "json"), default="regex")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--temps", default="0,1")
    ap.add_argument("--arms", default="cut,append,none")
    ap.add_argument("--seeds", type=int, default=1, help="batches per arm and temperature (other prompts and sampling seeds)")
    ap.add_argument("--trained", action="store_true", help="the default model's weights, not the tiny dummy model")
    a = ap.parse_args()
    cpu = argparse.Namespace(smoke=True, tokenizer=None, backends=["outlines"], grammar_threads=0, jump_forward_max_batch=0)
    if a.trained:
        import radixflow

        eng = radixflow.Engine(device="cpu", grammar_backend="outlines", overlap_schedule="on", jump_forward_max_batch=0,
                               grammar_compile_timeout_s=120.0)  # fmt: skip
    else:
        eng = make_engine(cpu, max_total_tokens=65536)
    try:
        for temp in (float(t) for t in a.temps.split(",")):
            for seed in range(a.seeds):
                for arm in a.arms.split(","):
                    print(json.dumps(run(eng, a.kind, temp, a.rows, arm, seed)), flush=True)
    finally:
        eng.shutdown()


if __name__ == "__main__":
    main()
