"""Section memory: where the device memory of the bench engine goes (weights, KV pool, the rest), and the
most torch reserved since the engine was built, so the KV pool's headroom (--mem-fraction-static) can be
set from what a run really takes. Run it after the sections whose peak it should see. Section logprob_peak: the
worst case we know of, a long prompt's input logprobs with top-k ([chunk, vocab] float32 logits), alone."""

from __future__ import annotations

import random

import torch

from gpubench.common import DEV, OPTS, SZ, rand_ids

GIB = 2**30


def sec_memory() -> dict:
    eng = OPTS.bench_engine
    runner = eng.runner
    params = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    pool = runner.kv_pool
    pool_bytes = sum(t.numel() * t.element_size() for t in (*pool.k, *pool.v))
    out = {"params_GiB": params / GIB, "kv_pool_GiB": pool_bytes / GIB, "kv_pool_tokens": pool.k[0].shape[0],
           "plan_GiB": {k: v / GIB for k, v in runner.memory_plan.items()}}
    if DEV == "cuda":
        free, total = torch.cuda.mem_get_info()
        allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        peak = torch.cuda.max_memory_reserved()
        out.update(total_GiB=total / GIB, free_now_GiB=free / GIB, allocated_GiB=allocated / GIB,
                   reserved_GiB=reserved / GIB, max_reserved_GiB=peak / GIB,
                   outside_torch_GiB=(total - free - reserved) / GIB,
                   peak_beyond_weights_and_pool_GiB=(peak - params - pool_bytes) / GIB)
    return out


def sec_logprob_peak() -> dict:
    """The device memory one request of lp_len random tokens with input logprobs from its first token and
    lp_top top logprobs reserves beyond what was reserved before it (peak stats reset first): what the KV pool's
    headroom must hold for it, at the engine's chunked-prefill size."""
    eng = OPTS.bench_engine
    ids = rand_ids(random.Random(7), SZ["lp_len"])
    out = {"prompt_tokens": len(ids), "top_logprobs_num": SZ["lp_top"],
           "chunked_prefill_size": eng.server_args.chunked_prefill_size}
    if DEV == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_reserved()
    res = eng.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0.0}, return_logprob=True,
                       logprob_start_len=0, top_logprobs_num=SZ["lp_top"], return_text_in_logprobs=False)
    out["input_logprobs"] = len(res["meta_info"]["input_token_logprobs"])
    if DEV == "cuda":
        torch.cuda.synchronize()
        out.update(reserved_before_GiB=before / GIB, peak_GiB=torch.cuda.max_memory_reserved() / GIB,
                   peak_above_before_GiB=(torch.cuda.max_memory_reserved() - before) / GIB)
    return out
