"""CUDA graphs for small extend passes (--cuda-graph-extend-max-tokens), beside the decode graphs.

LLM programs continue many requests by a few tens of tokens each: extend passes small enough
that launching their few hundred kernels one by one from Python takes longer than the GPU's
work. This runner captures one graph per bucket of padded token and request counts
(extend_static_batch.py: how a pass is padded, and why no real row sees the padding) and
replays the smallest bucket that holds a pass.

Inside the graph, attention is the Triton extend kernel over the KV pool for every row, its
grid bound by the bucket (AttentionBackend.init_static_extend). torch's flash varlen kernel,
which eager passes use for prompt-only rows, stays out: which rows could take it changes from
pass to pass. Small passes are mostly continuations over a cached prefix, which the Triton
kernel computes anyway.

A pass runs eagerly instead (`bucket_for` returns None) when it is a decode pass, has more new
tokens than the largest bucket, more requests than the request cap, or more logits rows than its
bucket has request rows (input logprobs over many prompt tokens).

Every graph writes its logits into one shared buffer (`self.out`), so the graphs hold one
[largest request bucket, vocab] float32 buffer instead of one per bucket. A replay's logits are
valid until the next extend replay: every consumer (the scheduler's sampling, input logprobs and
`torch.cat` of the finishing rows, deferred sampling under overlap scheduling included) enqueues
its reads of them on the same stream before the next pass is launched, so the next replay's
writes come after them on the GPU. The decode graphs keep their own logits.

With `use_graphs=False` (the CPU, where graphs cannot be captured) the same padded passes run
eagerly, into the same shared buffer: what the tests compare with unpadded eager passes, and the
buffer's reuse is exercised by the CPU tests too (one copy a pass).
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from radixflow.runtime.execution.cuda_graph_runner import capture_graphs
from radixflow.runtime.execution.extend_static_batch import (
    ExtendBucket, StaticExtendInputs, extend_buckets, pick_bucket,
)  # fmt: skip
from radixflow.runtime.execution.forward_batch import ForwardBatch, ForwardMode

log = logging.getLogger(__name__)


# the capture stream's cuBLAS workspace (32 MiB on Hopper) and the caching allocator's rounding to 2 MiB blocks
CAPTURE_SLACK_BYTES = 64 << 20


def graph_memory_bytes(hidden: int, intermediate: int, vocab: int, max_tokens: int, max_reqs: int) -> int:
    """An upper estimate of the most the extend graphs' capture reserves on the device: the shared float32
    logits, the capture's own logits before they are copied there, the largest bucket's activations in
    float32 (residual, norm, attention, and the MLP's gate, up and product), CAPTURE_SLACK_BYTES; and the
    eager warm-up passes' logits and activations, which stay cached for the capture stream (outside the
    graphs' pool) until capture_graphs gives them back at its end."""
    logits, activations = max_reqs * vocab * 4, max_tokens * (6 * hidden + 3 * intermediate) * 4
    return 3 * logits + 2 * activations + CAPTURE_SLACK_BYTES


@dataclass
class CaptureCost:
    """What capturing the extend graphs took, against graph_memory_bytes' estimate: the device memory
    allocated and reserved after capture minus before (the graphs' pool, the shared logits, the static
    inputs, the capture stream's workspace), the most reserved during capture minus before (the warm-up
    passes' blocks too, which capture_graphs gives back at its end: what must fit), and the seconds."""

    estimate_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    peak_reserved_bytes: int
    seconds: float
    graphs: int


def memory_mark() -> tuple[int, int, float]:
    """Allocated and reserved device memory and the time before capture, with what is cached now given
    back and the peak counters reset, so that capture's own peak is what max_memory_reserved() reads."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), time.perf_counter()


class ExtendGraphRunner:
    def __init__(self, model, backend, max_tokens: int, max_reqs: int, device: str = "cuda", use_graphs: bool = True):
        if use_graphs:
            start = memory_mark()
        self.model = model
        self.backend = backend
        self.buckets = extend_buckets(max_tokens, max_reqs)
        self.inputs = StaticExtendInputs(self.buckets, device)
        self.use_graphs = use_graphs
        self.graphs: dict[ExtendBucket, torch.cuda.CUDAGraph] = {}
        # every padded pass's logits, in its first rows (graphs and the eager padded pass alike)
        vocab = model.shape.vocab_size
        self.out = torch.zeros(max(b.reqs for b in self.buckets), vocab, dtype=torch.float32, device=self.inputs.device)
        self.extend_passes = self.replays = 0  # how many extend passes asked, how many a bucket took
        self.capture_cost: Optional[CaptureCost] = None
        if use_graphs:
            self.graphs, _ = capture_graphs(self.buckets, self._prepare)
            self.capture_cost = self._cost(start, max_tokens, max_reqs)

    def _cost(self, start: tuple[int, int, float], max_tokens: int, max_reqs: int) -> CaptureCost:
        s = self.model.shape
        cost = CaptureCost(graph_memory_bytes(s.hidden, s.intermediate, s.vocab_size, max_tokens, max_reqs),
                           torch.cuda.memory_allocated() - start[0], torch.cuda.memory_reserved() - start[1],
                           torch.cuda.max_memory_reserved() - start[1], time.perf_counter() - start[2],
                           len(self.graphs))  # fmt: skip
        log.info("captured %d extend CUDA graphs (up to %d tokens, %d requests) in %.1fs: %.0f MiB reserved, "
                 "%.0f MiB at the peak (estimate %.0f MiB)", cost.graphs, max_tokens, max_reqs, cost.seconds,
                 cost.reserved_bytes / 2**20, cost.peak_reserved_bytes / 2**20, cost.estimate_bytes / 2**20)
        return cost

    def bucket_for(self, fb: ForwardBatch) -> Optional[ExtendBucket]:
        """The bucket whose graph runs `fb`, or None: eager."""
        if fb.mode != ForwardMode.EXTEND:
            return None
        self.extend_passes += 1
        return pick_bucket(self.buckets, fb.num_tokens, fb.batch_size, fb.logits_indices.numel())

    def replay(self, fb: ForwardBatch, bucket: ExtendBucket) -> torch.Tensor:
        """Logits of fb's `logits_indices` rows, from the padded pass in `bucket`: a view of the shared
        buffer, valid until the next extend replay (the module's docstring says why the scheduler's
        reads come first)."""
        self.replays += 1
        lists = self.inputs.fill(fb, bucket)
        n = fb.logits_indices.numel()
        if not self.use_graphs:
            return self._forward_into_shared(self._static_batch(bucket, lists))[:n]
        self.graphs[bucket].replay()
        return self.out[:n]

    def _static_batch(self, bucket: ExtendBucket, lists: tuple[list, list, list]) -> ForwardBatch:
        fb = self.inputs.batch(bucket, lists)
        self.backend.init_static_extend(fb, self.inputs.q_start[: bucket.reqs + 1], bucket.tokens)
        return fb

    def _forward(self, fb: ForwardBatch) -> torch.Tensor:
        return self.model.compute_logits(self.model(fb, self.backend))

    def _forward_into_shared(self, fb: ForwardBatch) -> torch.Tensor:
        """The captured pass: its logits copied into the shared buffer, so the capture's own are freed
        for the next capture in the pool to reuse."""
        logits = self._forward(fb)
        return self.out[: logits.shape[0]].copy_(logits)

    def _prepare(self, bucket: ExtendBucket) -> Callable[[], torch.Tensor]:
        fb = self._static_batch(bucket, self.inputs.fill(None, bucket))  # padding only: writes slot 0
        return functools.partial(self._forward_into_shared, fb)
