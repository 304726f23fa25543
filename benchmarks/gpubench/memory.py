"""Section memory: where the device memory of the bench engine goes (weights, KV pool, the rest), and the
most torch reserved since the engine was built, so the KV pool's headroom (--mem-fraction-static) can be
set from what a run really takes. Run it after the sections whose peak it should see."""

from __future__ import annotations

import torch

from gpubench.common import DEV, OPTS

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
