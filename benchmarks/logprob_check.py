"""Teacher-forced logprob comparison of two attention backends on one Engine.

A batch mixes fresh prompts, radix-cache hits (a shared prefix cached by an earlier
request) and a prompt longer than the chunked-prefill size. Prompt logprobs come
from extend passes; generated tokens' logprobs come from decode passes and are
checked by teacher forcing: the reference run scores the candidate's generated
tokens as part of its prompt. Used by benchmarks/gpu_bench.py and tests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class RunLogprobs:
    prompts: list  # input ids per request
    input_lps: list  # per request: logprobs of the scored prompt positions
    output_ids: list
    output_lps: list


def make_prompts(vocab: int, shared_len: int, long_len: int, seed: int = 0) -> tuple[list, list, list]:
    """(warm-up prompts, batch prompts, logprob start per batch prompt)."""
    rng = random.Random(seed)

    def ids(n: int) -> list:
        return [rng.randrange(3, vocab) for _ in range(n)]

    shared = ids(shared_len)
    warm = [shared + ids(3)]
    batch = [ids(17), ids(shared_len // 2 + 5), shared + ids(9), shared + ids(23), ids(long_len)]
    starts = [0, 0, shared_len, shared_len, 0]
    return warm, batch, starts


def _params(n: int) -> dict:
    return {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}


def run_candidate(engine, warm: list, batch: list, starts: list, new_tokens: int) -> RunLogprobs:
    engine.flush_cache()
    engine.generate(input_ids=warm, sampling_params=_params(1))
    outs = engine.generate(
        input_ids=batch, sampling_params=_params(new_tokens), return_logprob=True, logprob_start_len=starts
    )
    return RunLogprobs(
        prompts=batch,
        input_lps=[[lp for lp, _, _ in o["meta_info"]["input_token_logprobs"] if lp is not None] for o in outs],
        output_ids=[[t for _, t, _ in o["meta_info"]["output_token_logprobs"]] for o in outs],
        output_lps=[[lp for lp, _, _ in o["meta_info"]["output_token_logprobs"]] for o in outs],
    )


def run_reference(engine, warm: list, cand: RunLogprobs, starts: list) -> RunLogprobs:
    """Score the candidate's prompts and generated tokens in one prefill each."""
    engine.flush_cache()
    engine.generate(input_ids=warm, sampling_params=_params(1))
    full = [p + o for p, o in zip(cand.prompts, cand.output_ids)]
    outs = engine.generate(input_ids=full, sampling_params=_params(1), return_logprob=True, logprob_start_len=starts)
    input_lps, output_lps = [], []
    for o, p, s in zip(outs, cand.prompts, starts):
        lps = [lp for lp, _, _ in o["meta_info"]["input_token_logprobs"] if lp is not None]
        n_prompt = len(p) - max(s, 1)  # scored prompt positions (position 0 has none)
        input_lps.append(lps[:n_prompt])
        output_lps.append(lps[n_prompt:])
    return RunLogprobs(cand.prompts, input_lps, cand.output_ids, output_lps)


def max_abs_diff(a: list, b: list) -> float:
    worst = 0.0
    for xs, ys in zip(a, b):
        assert len(xs) == len(ys), (len(xs), len(ys))
        worst = max([worst] + [abs(x - y) for x, y in zip(xs, ys)])
    return worst


def mean_abs_diff(a: list, b: list) -> float:
    diffs = [abs(x - y) for xs, ys in zip(a, b) for x, y in zip(xs, ys)]
    return sum(diffs) / max(len(diffs), 1)


def compare(cand: RunLogprobs, ref: RunLogprobs) -> dict:
    return {
        "prefill_max_abs": max_abs_diff(cand.input_lps, ref.input_lps),
        "decode_max_abs": max_abs_diff(cand.output_lps, ref.output_lps),
        "mean_abs": mean_abs_diff(cand.input_lps + cand.output_lps, ref.input_lps + ref.output_lps),
        "scored": sum(map(len, cand.input_lps)) + sum(map(len, cand.output_lps)),
    }
