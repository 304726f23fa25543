"""Attention in plain torch, reading K/V through req_to_token. Used on CPU.

When every request of a batch starts with the same KV slots (a prefix the radix cache
shares), that prefix is read once for the whole batch: all queries attend to it in one
dense product, each request attends to the rest of its own KV, and the two partial
results are merged by their log-sum-exp (cascade attention). Without it, a decode step
over 64 requests sharing a 1,000-token prompt gathers 64,000 K/V rows per layer instead
of ~1,000.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from radixflow.runtime.execution.attention.base import AttentionBackend
from radixflow.runtime.execution.forward_batch import ForwardBatch, ForwardMode

MIN_SHARED_PREFIX = 32  # below this, one gather per request is as cheap as the merge


@dataclass
class NativeMetadata:
    shared: Optional[torch.Tensor]  # [P] slots every request starts with, or None
    # decode: [B, L] slots after the shared prefix and a [B, 1, 1, L] validity mask;
    # extend: one slot tensor per request (after the shared prefix)
    rest: object
    valid: Optional[torch.Tensor] = None


def shared_prefix_len(slots: torch.Tensor, limit: int) -> int:
    """How many leading columns of `slots` [B, >= limit] are equal in every row (at most `limit`)."""
    if slots.shape[0] < 2 or limit < MIN_SHARED_PREFIX:
        return 0
    differs = (slots[:, :limit] != slots[:1, :limit]).any(0)
    return int(differs.to(torch.int8).argmax()) if bool(differs.any()) else limit


class TorchNativeBackend(AttentionBackend):
    # What attention computes in, whatever the model's dtype (16-bit q and K/V widen exactly).
    # float64 is exact attention: the yardstick of benchmarks/gpu_bench.py and gpu_real_model.py.
    compute_dtype = torch.float32

    def _batched_decode(self, fb: ForwardBatch) -> bool:
        """Decode as one padded batch. Deterministic mode decodes each request alone instead, as a
        one-token extend: no shape of the product depends on the other requests."""
        return fb.mode == ForwardMode.DECODE and not self.deterministic

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        table = self.req_to_token.table
        if self._batched_decode(fb):
            max_len = max(fb.seq_lens_list)
            slots = table[fb.req_pool_indices, :max_len].to(torch.int64)
            p = shared_prefix_len(slots, min(fb.seq_lens_list) - 1)
            cols = torch.arange(p, max_len, device=slots.device)
            valid = cols.unsqueeze(0) < fb.seq_lens.unsqueeze(1)  # [B, L - p]
            shared = slots[0, :p] if p else None
            fb.attn_metadata = NativeMetadata(shared, slots[:, p:], valid.view(fb.batch_size, 1, 1, -1))
        else:
            min_pre = 0 if self.deterministic else min(fb.prefix_lens_list)
            p = shared_prefix_len(table[fb.req_pool_indices, :min_pre], min_pre) if min_pre else 0
            rows = fb.req_pool_indices.tolist()
            rest = [table[r, p:s].to(torch.int64) for r, s in zip(rows, fb.seq_lens_list)]
            fb.attn_metadata = NativeMetadata(table[rows[0], :p].to(torch.int64) if p else None, rest)

    def forward(self, q, k, v, layer, fb):
        """Attention in `compute_dtype` (float32), rounded once at the end: the reference the Triton
        kernels are held to (kernels/attention_common.py)."""
        self.kv_pool.store(layer, fb.out_cache_loc, k, v)
        return self._attend(q.to(self.compute_dtype), layer, fb).to(q.dtype)

    def _attend(self, q, layer, fb):
        meta: NativeMetadata = fb.attn_metadata
        if meta.shared is None:
            return self._decode(q, layer, meta) if self._batched_decode(fb) else self._extend(q, layer, fb, 0)
        shared_out, shared_lse = self._attend_shared(q, layer, meta.shared)
        if self._batched_decode(fb):
            rest_out, rest_lse = self._decode(q, layer, meta, with_lse=True)
        else:
            rest_out, rest_lse = self._extend(q, layer, fb, meta.shared.numel(), with_lse=True)
        return merge_partials(shared_out, shared_lse, rest_out, rest_lse)

    def _kv(self, layer: int, slots: torch.Tensor, dtype) -> tuple:
        pool = self.kv_pool
        if pool.fp8:  # gathered as bytes, then dequantized with the per-head scales
            return (gather_fp8_rows(pool.k[layer], slots, pool.k_scale[layer], dtype),
                    gather_fp8_rows(pool.v[layer], slots, pool.v_scale[layer], dtype))
        return gather_rows(pool.k[layer], slots, dtype), gather_rows(pool.v[layer], slots, dtype)

    def _attend_shared(self, q, layer, shared):
        """Every query of the batch over the shared prefix (no mask: all of them come after it)."""
        t, hq, d = q.shape
        hkv = self.num_kv_heads
        k, v = self._kv(layer, shared, q.dtype)  # [P, Hkv, D]
        qg = q.view(t, hkv, hq // hkv, d).permute(1, 0, 2, 3).reshape(hkv, -1, d)  # [Hkv, T*G, D]
        out, lse = attend_with_lse(qg, k.transpose(0, 1), v.transpose(0, 1), None, self.scale)
        to_tokens = lambda x: x.view(hkv, t, hq // hkv, -1).permute(1, 0, 2, 3).reshape(t, hq, -1)  # noqa: E731
        return to_tokens(out), to_tokens(lse)

    def _decode(self, q, layer, meta: NativeMetadata, with_lse: bool = False):
        k, v = self._kv(layer, meta.rest, q.dtype)  # [B, L, Hkv, D]
        kc, vc = k.transpose(1, 2), v.transpose(1, 2)  # [B, Hkv, L, D]
        b, hq, d = q.shape
        hkv = self.num_kv_heads
        qg = q.view(b, hkv, hq // hkv, d)  # [B, Hkv, G, D]: a KV head's G query heads as G queries
        if not with_lse:
            out = F.scaled_dot_product_attention(qg, kc, vc, attn_mask=meta.valid, scale=self.scale)
            return out.reshape(b, hq, d)
        out, lse = attend_with_lse(qg, kc, vc, meta.valid.view(b, 1, 1, -1), self.scale)
        return out.reshape(b, hq, d), lse.reshape(b, hq, 1)

    def _extend(self, q, layer, fb, shared_len: int, with_lse: bool = False):
        """Each request's new tokens over its KV after the shared prefix (a loop over requests)."""
        outs, lses, start = [], [], 0
        for slots, pre, ext in zip(fb.attn_metadata.rest, fb.prefix_lens_list, fb.extend_lens_list):
            qr = q[start : start + ext].transpose(0, 1)  # [Hq, E, D]
            k, v = self._kv(layer, slots, q.dtype)
            kr, vr = k.transpose(0, 1), v.transpose(0, 1)  # [Hkv, S, D]
            qpos = torch.arange(pre, pre + ext, device=q.device).unsqueeze(1)
            kpos = torch.arange(shared_len, pre + ext, device=q.device).unsqueeze(0)
            mask = kpos <= qpos  # [E, S]
            if with_lse:
                hq, e, d = qr.shape
                hkv = self.num_kv_heads
                o, lse = attend_with_lse(qr.reshape(hkv, -1, d), kr, vr, mask.repeat(hq // hkv, 1), self.scale)
                outs.append(o.view(hq, e, d).transpose(0, 1))
                lses.append(lse.view(hq, e, 1).transpose(0, 1))
            else:
                # 4-D inputs: torch's CPU flash kernel takes only those (3-D falls back to ~2.5x slower math)
                o = F.scaled_dot_product_attention(
                    qr.unsqueeze(0), kr.unsqueeze(0), vr.unsqueeze(0), attn_mask=mask, scale=self.scale, enable_gqa=True
                )
                outs.append(o[0].transpose(0, 1))
            start += ext
        if with_lse:
            return torch.cat(outs, dim=0), torch.cat(lses, dim=0)
        return torch.cat(outs, dim=0)


def gather_rows(pool: torch.Tensor, slots: torch.Tensor, dtype) -> torch.Tensor:
    """pool[slots] for a `[N, H, D]` pool. An embedding lookup copies whole rows and is
    several times faster on CPU than advanced indexing, which dominated decode there."""
    n = pool.shape[0]
    rows = F.embedding(slots, pool.view(n, -1))
    return rows.view(*slots.shape, *pool.shape[1:]).to(dtype)


def gather_fp8_rows(pool: torch.Tensor, slots: torch.Tensor, scale: torch.Tensor, dtype) -> torch.Tensor:
    """An FP8 pool's rows at `slots`, times each KV head's scale, in `dtype`."""
    rows = gather_rows(pool.view(torch.uint8), slots, torch.uint8).view(pool.dtype)
    return (rows.to(torch.float32) * scale[:, None]).to(dtype)


def attend_with_lse(q, k, v, mask, scale: float) -> tuple:
    """Softmax attention that also returns each query's log-sum-exp, for merging.
    q [..., M, D], k/v [..., S, D] in one dtype (the backend's compute_dtype), mask broadcastable
    to [..., M, S] (True = attend)."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    return torch.matmul(torch.exp(s - lse), v), lse


def merge_partials(o1, lse1, o2, lse2) -> torch.Tensor:
    """Combine attention over two disjoint key sets from their normalized outputs and LSEs."""
    lse = torch.logaddexp(lse1, lse2)
    return o1 * torch.exp(lse1 - lse) + o2 * torch.exp(lse2 - lse)
