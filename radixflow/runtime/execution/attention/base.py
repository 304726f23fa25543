"""The attention backend interface.

A backend stores the new tokens' K/V into the pool at `out_cache_loc`, then computes
attention for the batch's queries over each request's KV, read through req_to_token.
"""

from __future__ import annotations

import torch

from radixflow.kernels.settings import DEFAULT_KERNEL_SETTINGS, KernelSettings
from radixflow.radix_cache.memory_pool import KVPool, ReqToTokenPool
from radixflow.runtime.execution.forward_batch import ForwardBatch
from radixflow.runtime.execution.layers.rotary import RotaryEmbedding


class AttentionBackend:
    supports_extend_graph = False  # init_static_extend's metadata can be captured in a CUDA graph
    deterministic = False  # batch-invariant: a request's result may not depend on its batch
    settings: KernelSettings = DEFAULT_KERNEL_SETTINGS  # each backend gets the runner's at construction

    def __init__(
        self, kv_pool: KVPool, req_to_token: ReqToTokenPool, num_q_heads: int, num_kv_heads: int, head_dim: int,
        deterministic: bool = False, settings: KernelSettings = DEFAULT_KERNEL_SETTINGS,
    ):
        self.deterministic = deterministic
        self.settings = settings  # ModelRunner.set_kernel_settings replaces it (and recaptures the graphs)
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token
        self.num_q_heads = num_q_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5

    def warm_up(self, dtype: torch.dtype) -> None:
        """At start-up, with activations of `dtype`: build what the first passes would otherwise build mid-run."""

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        """Called once per forward pass, before the first layer."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, fb: ForwardBatch) -> torch.Tensor:
        """q: [T, Hq, D], k/v: [T, Hkv, D] -> [T, Hq, D]."""
        raise NotImplementedError

    def init_cuda_graph_capture(self, fb: ForwardBatch) -> None:
        """Before a decode graph of fb.batch_size is captured, outside the capture (CudaGraphRunner).
        A backend whose metadata is planned on the host (FlashInfer) binds fixed buffers here."""

    def init_cuda_graph_replay(self, fb: ForwardBatch, padded_bs: int) -> None:
        """Before the graph of `padded_bs` is replayed for the real batch `fb`, outside the graph."""

    def init_static_extend(self, fb: ForwardBatch, q_start: torch.Tensor, max_extend: int) -> None:
        """Metadata for a padded extend pass of fixed shapes (extend_graph_runner.py): some requests may have
        no new tokens; `q_start` [B] holds each request's first row, `max_extend` bounds any request's new
        tokens. This default plans from fb's host lists, which is right without a graph only: a backend that
        sets `supports_extend_graph` must read nothing but fb's tensors and these."""
        self.init_forward_metadata(fb)

    def forward_rotary(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        rotary: RotaryEmbedding, layer: int, fb: ForwardBatch,
    ) -> torch.Tensor:
        """Rotary embedding on q/k, then `forward`; a backend may fuse the rotation with its KV store."""
        q, k = rotary(positions, q, k)
        return self.forward(q, k, v, layer, fb)

