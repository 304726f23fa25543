"""Attention through the Triton kernels in radixflow.kernels (the default on CUDA).

Decode reads only tensors of the ForwardBatch and a split count fixed per batch
size, so a decode pass can be captured in a CUDA graph and replayed with new
contents in the same buffers. An extend batch whose prompt-only rows (no cached
prefix) carry at least half its new tokens runs torch's variable-length flash kernel
over the step's own K/V where the device has it (kernels/flash_varlen.py); the rows
with a cached prefix are then computed again by the Triton extend kernel over the
pool, into the same output. A pass of prompt-only rows that all have one length (at least
kernels/cudnn_dense.MIN_LEN tokens) takes torch's cuDNN attention instead, on Hopper. 16-bit KV pools
only: float32 and FP8 keep the Triton kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from radixflow.host_copy import to_device_async
from radixflow.kernels.cudnn_dense import CudnnShapes, cudnn_dense_attention, cudnn_dense_supported
from radixflow.kernels.decode_attention import (
    DETERMINISTIC_CONFIG, DecodeRope, decode_attention, num_kv_splits, pool_kind,
)
from radixflow.kernels.extend_attention import extend_attention
from radixflow.kernels.extend_attention import warm_up as warm_up_extend
from radixflow.kernels.flash_varlen import FLASH_DTYPES, flash_varlen_attention, flash_varlen_supported
from radixflow.kernels.kv_store import store_kv
from radixflow.kernels.rotary import apply_rotary, apply_rotary_store_kv
from radixflow.runtime.execution.attention.base import AttentionBackend
from radixflow.runtime.execution.forward_batch import ForwardBatch, ForwardMode


@dataclass
class RowSet:
    """Some rows of an extend batch, as the Triton extend kernel takes them."""
    req_pool_indices: torch.Tensor
    prefix_lens: torch.Tensor
    extend_lens: torch.Tensor
    q_start: torch.Tensor
    max_extend: int


@dataclass
class ExtendPlan:
    """How an extend pass attends. Without `flash_cu`: the Triton kernel over all rows. With it: the flash
    kernel over every row's new tokens, then the Triton kernel over the `cached` rows (those with a
    cached prefix, if any), overwriting the flash results for them."""
    all_rows: RowSet
    cached: Optional[RowSet] = None
    flash_cu: Optional[torch.Tensor] = None  # int32 [B + 1] cumulative new tokens per row
    dense: Optional[tuple[int, int]] = None  # (rows, length): every row a fresh prompt of one length, through cuDNN


def cached_rows(prefix_lens: list[int]) -> list[int]:
    """Rows that attend to a cached prefix: the flash path (own tokens only) cannot compute them."""
    return [i for i, p in enumerate(prefix_lens) if p > 0]


def takes_flash(extend_lens: list[int], cached: list[int]) -> bool:
    """Whether a pass with the flash path enabled runs it: the prompt-only rows carry at least as many
    new tokens as the `cached` rows, whose new tokens the flash kernel computes for nothing (the Triton
    kernel computes them again)."""
    again = sum(extend_lens[i] for i in cached)
    fresh = sum(extend_lens) - again
    return fresh > 0 and fresh >= again


class TritonBackend(AttentionBackend):
    supports_cuda_graph = True
    supports_extend_graph = True
    fused_kernels = True  # the model's norm / rotary / SiLU can run as Triton kernels too
    gemv_epilogues = True  # the folded model's decode pass (layers/norm_fold.py) is tested with this backend

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        device = self.kv_pool.k[0].device
        cuda = device.type == "cuda"
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count if cuda else 8
        self.decode_config = DETERMINISTIC_CONFIG if self.deterministic else None  # None: tuned per batch size
        self.pool_kind = pool_kind(self.kv_pool.dtype)  # which DECODE_CONFIG pool entry its decode launches may take
        # The flash kernel takes 16-bit K/V straight from the step: a float32 pool, and an FP8 pool (its
        # prompt-only rows would skip the e4m3 rounding that every row read back from it has), keep the
        # Triton kernel, as does deterministic inference (one kernel for every row), whatever the settings.
        self.flash_ok = (self.kv_pool.dtype in FLASH_DTYPES and not self.deterministic
                         and flash_varlen_supported(str(device), self.num_q_heads, self.num_kv_heads, self.head_dim))
        self.cudnn_ok = self.flash_ok and cudnn_dense_supported(str(device), self.num_q_heads, self.num_kv_heads,
                                                                 self.head_dim)
        self.cudnn_shapes = CudnnShapes()

    def warm_up(self, dtype: torch.dtype) -> None:
        """Compile the extend kernel at each block size (extend_attention.warm_up), on CUDA."""
        if self.kv_pool.k[0].is_cuda:
            warm_up_extend(dtype, self.kv_pool.k[0], self.kv_pool.v[0], self.num_q_heads, self.req_to_token.table,
                           self._scales(0), self.settings)

    def flash_enabled(self) -> bool:
        """Whether extend passes may take the flash path: this backend can (`flash_ok`) and the settings ask."""
        return self.flash_ok and self.settings.flash_prefill

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if fb.mode == ForwardMode.DECODE:
            fb.attn_metadata = num_kv_splits(fb.batch_size, self.num_kv_heads, self.num_sms, config=self.decode_config,
                                            pool=self.pool_kind, head_dim=self.head_dim)
            return
        fb.attn_metadata = self.plan_extend(fb)

    def plan_extend(self, fb: ForwardBatch) -> ExtendPlan:
        """Which rows take which kernel, with the row tensors each needs, built once per pass on the host."""
        starts, acc = [], 0
        for n in fb.extend_lens_list:
            starts.append(acc)
            acc += n
        dev = fb.input_ids.device
        q_start = to_device_async(torch.tensor(starts, dtype=torch.int64), dev)
        all_rows = RowSet(fb.req_pool_indices, fb.prefix_lens, fb.extend_lens, q_start, max(fb.extend_lens_list))
        if not self.flash_enabled():  # the CPU, float32 and FP8 pools, deterministic mode: no row lists to build
            return ExtendPlan(all_rows)
        rows = cached_rows(fb.prefix_lens_list)
        if not takes_flash(fb.extend_lens_list, rows):
            return ExtendPlan(all_rows)
        cu = to_device_async(torch.tensor(starts + [acc], dtype=torch.int32), dev)
        if not rows:
            return ExtendPlan(all_rows, None, cu, self.cudnn_shape(fb.extend_lens_list))
        idx = to_device_async(torch.tensor(rows, dtype=torch.int64), dev)
        cached = RowSet(fb.req_pool_indices[idx], fb.prefix_lens[idx], fb.extend_lens[idx], q_start[idx],
                        max(fb.extend_lens_list[i] for i in rows))
        return ExtendPlan(all_rows, cached, cu)

    def cudnn_shape(self, extend_lens: list[int]) -> tuple[int, int] | None:
        """(rows, length) when a pass of prompt-only rows takes cuDNN (kernels/cudnn_dense.py), else None."""
        if not (self.cudnn_ok and self.settings.cudnn_prefill):
            return None
        return self.cudnn_shapes.take(extend_lens)

    def init_static_extend(self, fb: ForwardBatch, q_start: torch.Tensor, max_extend: int) -> None:
        """The Triton extend kernel over every row, with a grid bound by `max_extend`: rows with fewer new
        tokens, and padding rows with none, exit at once. No flash path: which rows could take it changes
        from pass to pass, while a graph's kernels are fixed when it is captured."""
        fb.attn_metadata = ExtendPlan(RowSet(fb.req_pool_indices, fb.prefix_lens, fb.extend_lens, q_start, max_extend))

    def _scales(self, layer: int):
        """An FP8 pool's per-head scales for the kernels (None otherwise)."""
        pool = self.kv_pool
        return (pool.k_scale[layer], pool.v_scale[layer]) if pool.fp8 else None

    def forward(self, q, k, v, layer, fb):
        store_kv(self.kv_pool.k[layer], self.kv_pool.v[layer], fb.out_cache_loc, k, v, self._scales(layer), self.settings)
        return self._attend(q, k, v, layer, fb)

    def rotary_in_attention(self, fb: ForwardBatch) -> bool:
        """Whether this pass's rotary and KV store run inside the decode-attention kernel: one launch a
        layer fewer on a latency-bound path. Larger batches keep the separate kernel, which rotates
        each q once instead of once a split."""
        return fb.mode == ForwardMode.DECODE and fb.batch_size <= self.settings.fused_rotary_max_batch

    def forward_rotary(self, positions, q, k, v, rotary, layer, fb):
        if rotary.kernels is None or not q.is_cuda:
            return super().forward_rotary(positions, q, k, v, rotary, layer, fb)
        if self.rotary_in_attention(fb):
            return self._decode(q, layer, fb, DecodeRope(positions, rotary.cos, rotary.sin, k, v, fb.out_cache_loc))
        if self.kv_pool.fp8:  # the fused rotary + store writes the pool's dtype unscaled: rotate, then store
            q, k = apply_rotary(positions, q, k, rotary.cos, rotary.sin, self.settings)
            return self.forward(q, k, v, layer, fb)
        k_buf, v_buf = self.kv_pool.k[layer], self.kv_pool.v[layer]
        apply_rotary_store_kv(positions, q, k, v, rotary.cos, rotary.sin, k_buf, v_buf, fb.out_cache_loc, self.settings)
        return self._attend(q, k, v, layer, fb)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, fb: ForwardBatch) -> torch.Tensor:
        """Attention for q; the pool already holds this batch's K/V, and k/v are the same (rotated) new K/V."""
        if fb.mode == ForwardMode.DECODE:
            return self._decode(q, layer, fb)
        plan: ExtendPlan = fb.attn_metadata
        if plan.flash_cu is None:
            return self._extend(q, layer, plan.all_rows)
        if plan.dense is not None:
            return cudnn_dense_attention(q, k, v, *plan.dense, self.scale)
        out = flash_varlen_attention(q, k, v, plan.flash_cu, plan.all_rows.max_extend, self.scale)
        return out if plan.cached is None else self._extend(q, layer, plan.cached, out)

    def _extend(self, q: torch.Tensor, layer: int, rows: RowSet, out: torch.Tensor | None = None) -> torch.Tensor:
        """The Triton extend kernel over the pool for `rows`, into `out` (a new tensor if None)."""
        return extend_attention(
            q, self.kv_pool.k[layer], self.kv_pool.v[layer], self.req_to_token.table, rows.req_pool_indices,
            rows.prefix_lens, rows.extend_lens, rows.q_start, rows.max_extend, self.scale, out=out,
            scales=self._scales(layer), settings=self.settings,
        )

    def _decode(self, q, layer, fb, rope: DecodeRope | None = None):
        """Decode attention over the pool; with `rope` the kernel first rotates q and stores the new K/V."""
        return decode_attention(q, self.kv_pool.k[layer], self.kv_pool.v[layer], self.req_to_token.table,
                                fb.req_pool_indices, fb.seq_lens, self.scale, fb.attn_metadata,
                                config=self.decode_config, rope=rope, scales=self._scales(layer), settings=self.settings)
