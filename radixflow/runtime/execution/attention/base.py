"""The attention backend interface.

A backend stores the new tokens' K/V into the pool at `out_cache_loc`, then computes
attention for the batch's queries over each request's KV, read through req_to_token.
"""

from __future__ import annotations

import torch

from radixflow.errors import RadixflowError
from radixflow.radix_cache.memory_pool import KVPool, ReqToTokenPool
from radixflow.runtime.execution.forward_batch import ForwardBatch
from radixflow.runtime.execution.layers.rotary import RotaryEmbedding


class AttentionBackend:
    deterministic = False  # batch-invariant: a request's result may not depend on its batch

    def __init__(
        self, kv_pool: KVPool, req_to_token: ReqToTokenPool, num_q_heads: int, num_kv_heads: int, head_dim: int,
        deterministic: bool = False,
    ):
        self.deterministic = deterministic
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token
        self.num_q_heads = num_q_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5

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

    def forward_rotary(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        rotary: RotaryEmbedding, layer: int, fb: ForwardBatch,
    ) -> torch.Tensor:
        """Rotary embedding on q/k, then `forward`; a backend may fuse the rotation with its KV store."""
        q, k = rotary(positions, q, k)
        return self.forward(q, k, v, layer, fb)


def create_attention_backend(name: str, device: str, **kwargs) -> AttentionBackend:
    if name == "auto":
        name = "triton" if device == "cuda" else "torch_native"
    if name == "torch_native":
        from radixflow.runtime.execution.attention.torch_native import TorchNativeBackend

        return TorchNativeBackend(**kwargs)
    if name == "triton":
        if device != "cuda":
            raise RadixflowError("attention_backend=triton needs a CUDA device; use torch_native on CPU")
        from radixflow.runtime.execution.attention.triton_backend import TritonBackend

        return TritonBackend(**kwargs)
    if name == "flashinfer":
        from radixflow.runtime.execution.attention.flashinfer_backend import FlashInferBackend

        return FlashInferBackend(**kwargs)
    raise RadixflowError(f"unknown attention backend {name!r}: choose triton, torch_native or flashinfer")
