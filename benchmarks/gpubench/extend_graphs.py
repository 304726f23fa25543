"""extend_graph_buckets: small extend passes replayed from their CUDA graph against the same pass launched
eagerly, per pass shape (review finding 2 of the extend graphs: a graph's attention grid is bound by its
bucket, so its empty programs may cost what the launch gaps saved).

Each shape is B requests of n new tokens over a cached prefix of P tokens (the K/V is whatever the pool
holds: only time is measured). Per shape: the bucket it takes, each path's CUDA-event time (median of
reps), and under torch.profiler each path's summed kernel time and the Triton extend-attention kernel's
share of it. On the CPU (--smoke) the "graph" path is the padded pass run eagerly.
"""

from __future__ import annotations

import torch

from gpubench.common import OPTS, SMOKE, cuda_time, free, log, make_engine
from gpubench.step_profile import _kernel_times

from radixflow.runtime.execution.forward_batch import ForwardBatch, ForwardMode

# (requests, new tokens each, cached prefix each): programs' continuations, then larger ones
SHAPES = [(64, 7, 600), (64, 4, 600), (16, 20, 600), (4, 100, 600), (32, 15, 600)]
MAX_TOKENS, MAX_REQS = 512, 64


def _batch(runner, reqs: int, new: int, prefix: int) -> ForwardBatch:
    """Request r in req_to_token row r + 1, its slots after the scratch slot 0 and the rows before it."""
    width, dev = prefix + new, runner.device
    slots = torch.arange(1, 1 + reqs * width, dtype=torch.int64).view(reqs, width)
    runner.req_to_token.table[1 : reqs + 1, :width] = slots.to(runner.req_to_token.table.dtype)
    t = lambda xs: torch.as_tensor(xs, dtype=torch.int64).to(dev)  # noqa: E731
    seq = [width] * reqs
    return ForwardBatch(
        mode=ForwardMode.EXTEND, input_ids=t(torch.randint(3, 1000, (reqs * new,))),
        positions=t(torch.arange(prefix, width).repeat(reqs)), out_cache_loc=t(slots[:, prefix:].reshape(-1)),
        req_pool_indices=t(range(1, reqs + 1)), seq_lens=t(seq), prefix_lens=t([prefix] * reqs),
        extend_lens=t([new] * reqs), logits_indices=t([(i + 1) * new - 1 for i in range(reqs)]),
        seq_lens_list=seq, prefix_lens_list=[prefix] * reqs, extend_lens_list=[new] * reqs,
    )  # fmt: skip


def _eager(runner, fb: ForwardBatch) -> torch.Tensor:
    runner.backend.init_forward_metadata(fb)
    return runner.model.compute_logits(runner.model(fb, runner.backend))


def _kernels(run) -> dict:
    kernels = _kernel_times(run)
    return {"kernel_ms": round(sum(ms for _, ms, _ in kernels), 4),
            "extend_attention_ms": round(sum(ms for n, ms, _ in kernels if "_extend_kernel" in n), 4)}


@torch.inference_mode()
def sec_extend_graph_buckets() -> dict:
    shapes = [(min(b, 4), min(n, 8), min(p, 24)) for b, n, p in SHAPES] if OPTS.smoke else SHAPES
    width = max(p + n for _, n, p in shapes)
    engine = make_engine("llama3-8b", dtype="bfloat16", max_running_requests=MAX_REQS,
                         max_total_tokens=max(b * (p + n) for b, n, p in shapes) + 1024, context_length=max(width, 1024),
                         cuda_graph_extend_max_tokens=SMOKE["pa_max"] if OPTS.smoke else MAX_TOKENS,
                         cuda_graph_extend_max_reqs=MAX_REQS)  # fmt: skip
    runner, out = engine.runner, {}
    try:
        for reqs, new, prefix in shapes:
            fb = _batch(runner, reqs, new, prefix)
            bucket = runner.extend_graphs.bucket_for(fb)
            if bucket is None:
                out[f"{reqs}x{new}+{prefix}"] = {"bucket": None}
                continue
            graph = lambda: runner.extend_graphs.replay(fb, bucket)  # noqa: E731
            eager = lambda: _eager(runner, fb)  # noqa: E731
            row = {"bucket": [bucket.tokens, bucket.reqs], "graph_ms": 1e3 * cuda_time(graph, 20),
                   "eager_ms": 1e3 * cuda_time(eager, 20)}
            row.update({f"graph_{k}": v for k, v in _kernels(graph).items()})
            row.update({f"eager_{k}": v for k, v in _kernels(eager).items()})
            out[f"{reqs}x{new}+{prefix}"] = row
            log(f"extend_graph_buckets {reqs}x{new}+{prefix}: {row}")
    finally:
        free(engine)
    return out
