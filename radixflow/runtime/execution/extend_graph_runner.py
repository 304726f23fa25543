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
tokens than the largest bucket, more requests than the request cap (or as many with padding,
which needs a row for the pad request), or more logits rows than its bucket has request rows
(input logprobs over many prompt tokens).

With `use_graphs=False` (the CPU, where graphs cannot be captured) the same padded passes run
eagerly: what the tests compare with unpadded eager passes.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Callable, Optional

import torch

from radixflow.runtime.execution.cuda_graph_runner import capture_graphs
from radixflow.runtime.execution.extend_static_batch import (
    ExtendBucket, StaticExtendInputs, extend_buckets, pick_bucket,
)  # fmt: skip
from radixflow.runtime.execution.forward_batch import ForwardBatch, ForwardMode

log = logging.getLogger(__name__)


class ExtendGraphRunner:
    def __init__(self, model, backend, max_tokens: int, max_reqs: int, device: str = "cuda", use_graphs: bool = True):
        self.model = model
        self.backend = backend
        self.buckets = extend_buckets(max_tokens, max_reqs)
        self.inputs = StaticExtendInputs(self.buckets, device)
        self.use_graphs = use_graphs
        self.graphs: dict[ExtendBucket, torch.cuda.CUDAGraph] = {}
        self.logits: dict[ExtendBucket, torch.Tensor] = {}
        self.extend_passes = self.replays = 0  # how many extend passes asked, how many a bucket took
        if use_graphs:
            self._capture_all()

    def bucket_for(self, fb: ForwardBatch) -> Optional[ExtendBucket]:
        """The bucket whose graph runs `fb`, or None: eager."""
        if fb.mode != ForwardMode.EXTEND:
            return None
        self.extend_passes += 1
        return pick_bucket(self.buckets, fb.num_tokens, fb.batch_size, fb.logits_indices.numel())

    def replay(self, fb: ForwardBatch, bucket: ExtendBucket) -> torch.Tensor:
        """Logits of fb's `logits_indices` rows, from the padded pass in `bucket`."""
        self.replays += 1
        lists = self.inputs.fill(fb, bucket)
        n = fb.logits_indices.numel()
        if not self.use_graphs:
            return self._forward(self._static_batch(bucket, lists))[:n]
        self.graphs[bucket].replay()
        return self.logits[bucket][:n]

    def _static_batch(self, bucket: ExtendBucket, lists: tuple[list, list, list]) -> ForwardBatch:
        fb = self.inputs.batch(bucket, lists)
        self.backend.init_static_extend(fb, self.inputs.q_start[: bucket.reqs], bucket.tokens)
        return fb

    def _forward(self, fb: ForwardBatch) -> torch.Tensor:
        return self.model.compute_logits(self.model(fb, self.backend))

    def _prepare(self, bucket: ExtendBucket) -> Callable[[], torch.Tensor]:
        fb = self._static_batch(bucket, self.inputs.fill(None, bucket))  # padding only: writes slot 0
        return functools.partial(self._forward, fb)

    def _capture_all(self) -> None:
        start = time.perf_counter()
        self.graphs, self.logits = capture_graphs(self.buckets, self._prepare)
        log.info("captured %d extend CUDA graphs (up to %d tokens, %d requests) in %.1fs", len(self.buckets),
                 self.buckets[-1].tokens, max(b.reqs for b in self.buckets), time.perf_counter() - start)
