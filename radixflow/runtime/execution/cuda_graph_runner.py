"""CUDA graphs for decode: capture one graph per padded batch size, replay per step.

A decode step launches a few hundred small kernels; replaying a captured graph
removes their launch cost. Each graph reads its inputs from static buffers, so a
replay copies the batch's tensors in, pads the rest (padded rows write their KV to
the scratch slot 0 and attend to one token), replays, and returns the first rows
of the static logits.

Every graph writes its logits into the first rows of one shared [max_bs, vocab] float32
buffer. A graph's own output would stay allocated as long as the graph: with a graph for
every batch up to 1,024 that was ~16 GiB of logits on Llama-3's vocabulary, taken from the
memory left beside the KV pool. A replay's logits are valid until the next decode replay,
as they were for consecutive steps of one batch size: every reader (sampling, logprobs,
deferred sampling under overlap scheduling) enqueues its reads before the next pass.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable, Optional

import torch

from radixflow.runtime.execution.forward_batch import ForwardBatch, ForwardMode

log = logging.getLogger(__name__)


def graph_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 (up to 64), then of 16, up to max_bs."""
    sizes = [s for s in (1, 2, 4) if s < max_bs]
    s = 8
    while s < max_bs:
        sizes.append(s)
        s += 8 if s < 64 else 16
    return sizes + [max_bs]


def capture(forward: Callable[[], torch.Tensor], stream: torch.cuda.Stream,
            pool: Optional[tuple]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """`forward` run twice on `stream` (compiles Triton kernels, settles cuBLAS workspaces), then captured
    into a graph that allocates from `pool` (None: a new one); returns (the CUDAGraph, its output)."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            forward()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        out = forward()
    return graph, out


@torch.inference_mode()
def capture_graphs(keys: list, prepare: Callable[[Any], Callable[[], torch.Tensor]]) -> tuple[dict, dict]:
    """A graph per key of the sorted `keys`, the largest first (the smaller graphs then reuse its memory),
    all in one memory pool: `prepare(key)` sets up the key's static batch and returns the pass to capture.
    Returns the graphs and their outputs, by key."""
    graphs, outputs, pool = {}, {}, None
    stream = torch.cuda.Stream()
    for key in reversed(keys):
        graphs[key], outputs[key] = capture(prepare(key), stream, pool)
        pool = graphs[key].pool()
    torch.cuda.synchronize()
    # the warm-up passes' blocks are cached for `stream`, which nothing runs on again: give them back
    torch.cuda.empty_cache()
    return graphs, outputs


class CudaGraphRunner:
    def __init__(self, model, backend, max_bs: int, device: str = "cuda"):
        self.model = model
        self.backend = backend
        self.sizes = graph_batch_sizes(max_bs)
        self.max_bs = max_bs
        n = max_bs
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.out_cache_loc = torch.zeros(n, dtype=torch.int64, device=device)  # slot 0: scratch page
        self.req_pool_indices = torch.zeros(n, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int64, device=device)
        self.arange = torch.arange(n, dtype=torch.int64, device=device)
        self.logits_out = torch.empty(n, model.shape.vocab_size, dtype=torch.float32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self._capture_all()

    def _static_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            mode=ForwardMode.DECODE,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            prefix_lens=self.seq_lens[:bs] - 1,
            extend_lens=torch.ones_like(self.seq_lens[:bs]),
            logits_indices=self.arange[:bs],
            seq_lens_list=[1] * bs,
            prefix_lens_list=[0] * bs,
            extend_lens_list=[1] * bs,
        )

    def _forward(self, fb: ForwardBatch) -> torch.Tensor:
        self.backend.init_forward_metadata(fb)
        return self.model.compute_logits(self.model(fb, self.backend), out=self.logits_out[: fb.batch_size])

    def _prepare(self, bs: int) -> Callable[[], torch.Tensor]:
        fb = self._static_batch(bs)
        self.backend.init_cuda_graph_capture(fb)  # outside the capture: host-side planning
        return functools.partial(self._forward, fb)

    def _capture_all(self) -> None:
        start = time.perf_counter()
        self.graphs, self.logits = capture_graphs(self.sizes, self._prepare)
        log.info("captured %d CUDA graphs (bs %s) in %.1fs", len(self.sizes), self.sizes, time.perf_counter() - start)

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.mode == ForwardMode.DECODE and fb.batch_size <= self.max_bs

    def padded_size(self, bs: int) -> int:
        return next(s for s in self.sizes if s >= bs)

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        bs = fb.batch_size
        padded = self.padded_size(bs)
        if padded > bs:
            self.out_cache_loc[bs:padded].zero_()  # stale slots may belong to live requests now
            self.seq_lens[bs:padded].fill_(1)
        # one multi-tensor kernel instead of five copies: each op outside the graph costs the GPU a
        # launch gap, and at batch 1 these gaps are most of the time between replays
        statics = (self.input_ids, self.positions, self.out_cache_loc, self.req_pool_indices, self.seq_lens)
        torch._foreach_copy_([t[:bs] for t in statics],
                             [fb.input_ids, fb.positions, fb.out_cache_loc, fb.req_pool_indices, fb.seq_lens])
        self.backend.init_cuda_graph_replay(fb, padded)
        self.graphs[padded].replay()
        return self.logits_out[:bs]
