"""Output tokens with and without jump-forward after sampled tokens, on a trained model (CPU).

The GPU benchmark runs random weights, whose choice among the allowed tokens says nothing about how
a trained model splits a grammar's forced text; this runs the default model (SmolLM2-135M-Instruct)
on the GPU benchmark's JSON schema and regex, outlines backend, 16 rows, greedy and T 1 (seeded),
and prints each arm's output tokens, characters, valid outputs and tokens appended by jump-forward.
"Off" keeps the jump at admission (before the prefill) and drops the later ones, as an overlapped
llguidance batch above --jump-forward-max-batch does (here for outlines rows too, which the engine
lets jump in any batch).

    python benchmarks/jump_lengths_cpu.py [--backend outlines|llguidance] [--rows 16]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import constrained_gpu as cg  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="outlines", choices=("outlines", "llguidance"))
    ap.add_argument("--rows", type=int, default=16)
    a = ap.parse_args()
    from radixflow import Engine
    from radixflow.constrained.matcher import GrammarMatcher

    eng = Engine(grammar_backend=a.backend, device="cpu", grammar_compile_timeout_s=120.0)  # outlines on a busy CPU
    sched = eng.scheduler
    prompts = cg.prompts(a.rows)
    try:
        for kind in ("json", "regex"):
            for temp in (0.0, 1.0):
                params = [dict(cg.grammar_params(kind, temp), sampling_seed=i) for i in range(a.rows)]
                arms = {}
                for jump in (True, False):
                    sched.jumps_after_sampling = lambda rows, jump=jump: jump
                    GrammarMatcher.jumps_in_any_batch = jump
                    outs = eng.generate(prompts, params)
                    arms[jump] = (sum(o["meta_info"]["completion_tokens"] for o in outs), sum(len(o["text"]) for o in outs),
                                  sum(cg.valid(kind, o["text"]) for o in outs), sum(o["meta_info"].get("jump_forward_tokens", 0) for o in outs))  # fmt: skip
                print(f"{a.backend} {kind} T{temp:g}: tokens / chars / valid / jumped: on {arms[True]}, off {arms[False]}", flush=True)
    finally:
        sched.__dict__.pop("jumps_after_sampling", None)
        GrammarMatcher.jumps_in_any_batch = True
        eng.shutdown()


if __name__ == "__main__":
    main()
