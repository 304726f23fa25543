"""Attention through the Triton kernels in radixflow.kernels (the default on CUDA).

Decode reads only tensors of the ForwardBatch and a split count fixed per batch
size, so a decode pass can be captured in a CUDA graph and replayed with new
contents in the same buffers.
"""

from __future__ import annotations

import torch

from radixflow.host_copy import to_device_async
from radixflow.kernels.decode_attention import DETERMINISTIC_CONFIG, DecodeRope, decode_attention, num_kv_splits
from radixflow.kernels.extend_attention import extend_attention
from radixflow.kernels.kv_store import store_kv
from radixflow.kernels.rotary import apply_rotary, apply_rotary_store_kv
from radixflow.runtime.execution.attention.base import AttentionBackend
from radixflow.runtime.execution.forward_batch import ForwardBatch, ForwardMode


class TritonBackend(AttentionBackend):
    supports_cuda_graph = True
    fused_kernels = True  # the model's norm / rotary / SiLU run as Triton kernels too
    # Decode batches up to this size run rotary and the KV store inside the attention kernel: one
    # launch a layer fewer on a latency-bound path (batch 1: -0.7% / -2.3% replay time on an H200).
    # Larger batches keep the separate kernel, which rotates each q once instead of once a split.
    rotary_in_decode_attention_max_batch = 8

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        device = self.kv_pool.k[0].device
        cuda = device.type == "cuda"
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count if cuda else 8
        self.decode_config = DETERMINISTIC_CONFIG if self.deterministic else None  # None: tuned per batch size
        if self.deterministic:  # the separate rotary kernel at every batch size: one rounding of q and k for all
            self.rotary_in_decode_attention_max_batch = 0

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if fb.mode == ForwardMode.DECODE:
            fb.attn_metadata = num_kv_splits(fb.batch_size, self.num_kv_heads, self.num_sms, config=self.decode_config)
            return
        starts, acc = [], 0
        for n in fb.extend_lens_list:
            starts.append(acc)
            acc += n
        q_start = to_device_async(torch.tensor(starts, dtype=torch.int64), fb.input_ids.device)
        fb.attn_metadata = (q_start, max(fb.extend_lens_list))

    def _scales(self, layer: int):
        """An FP8 pool's per-head scales for the kernels (None otherwise)."""
        pool = self.kv_pool
        return (pool.k_scale[layer], pool.v_scale[layer]) if pool.fp8 else None

    def forward(self, q, k, v, layer, fb):
        store_kv(self.kv_pool.k[layer], self.kv_pool.v[layer], fb.out_cache_loc, k, v, self._scales(layer))
        return self._attend(q, layer, fb)

    def rotary_in_attention(self, fb: ForwardBatch) -> bool:
        """Whether this pass's rotary and KV store run inside the decode-attention kernel."""
        return fb.mode == ForwardMode.DECODE and fb.batch_size <= self.rotary_in_decode_attention_max_batch

    def forward_rotary(self, positions, q, k, v, rotary, layer, fb):
        if not (rotary.fused and q.is_cuda):
            return super().forward_rotary(positions, q, k, v, rotary, layer, fb)
        if self.rotary_in_attention(fb):
            return self._decode(q, layer, fb, DecodeRope(positions, rotary.cos, rotary.sin, k, v, fb.out_cache_loc))
        if self.kv_pool.fp8:  # the fused rotary + store writes the pool's dtype unscaled: rotate, then store
            q, k = apply_rotary(positions, q, k, rotary.cos, rotary.sin)
            return self.forward(q, k, v, layer, fb)
        k_buf, v_buf = self.kv_pool.k[layer], self.kv_pool.v[layer]
        apply_rotary_store_kv(positions, q, k, v, rotary.cos, rotary.sin, k_buf, v_buf, fb.out_cache_loc)
        return self._attend(q, layer, fb)

    def _attend(self, q, layer, fb):
        """Attention over the pool, which already holds this batch's K/V."""
        if fb.mode == ForwardMode.DECODE:
            return self._decode(q, layer, fb)
        q_start, max_extend = fb.attn_metadata
        return extend_attention(
            q, self.kv_pool.k[layer], self.kv_pool.v[layer], self.req_to_token.table, fb.req_pool_indices,
            fb.prefix_lens, fb.extend_lens, q_start, max_extend, self.scale, scales=self._scales(layer),
        )

    def _decode(self, q, layer, fb, rope: DecodeRope | None = None):
        """Decode attention over the pool; with `rope` the kernel first rotates q and stores the new K/V."""
        return decode_attention(q, self.kv_pool.k[layer], self.kv_pool.v[layer], self.req_to_token.table,
                                fb.req_pool_indices, fb.seq_lens, self.scale, fb.attn_metadata,
                                config=self.decode_config, rope=rope, scales=self._scales(layer))
