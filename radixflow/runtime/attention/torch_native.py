"""Attention in plain torch (SDPA), reading K/V through req_to_token. Used on CPU."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixflow.runtime.attention.base import AttentionBackend
from radixflow.runtime.forward_batch import ForwardBatch, ForwardMode


class TorchNativeBackend(AttentionBackend):
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        table = self.req_to_token.table
        if fb.mode == ForwardMode.DECODE:
            max_len = max(fb.seq_lens_list)
            slots = table[fb.req_pool_indices, :max_len].to(torch.int64)
            cols = torch.arange(max_len, device=slots.device)
            valid = cols.unsqueeze(0) < fb.seq_lens.unsqueeze(1)  # [B, L]
            fb.attn_metadata = (slots, valid.view(fb.batch_size, 1, 1, max_len))
        else:
            rows = fb.req_pool_indices.tolist()
            fb.attn_metadata = [table[r, :s].to(torch.int64) for r, s in zip(rows, fb.seq_lens_list)]

    def forward(self, q, k, v, layer, fb):
        self.kv_pool.store(layer, fb.out_cache_loc, k, v)
        if fb.mode == ForwardMode.DECODE:
            return self._decode(q, layer, fb)
        return self._extend(q, layer, fb)

    def _decode(self, q, layer, fb):
        slots, valid = fb.attn_metadata
        kc = self.kv_pool.k[layer][slots].transpose(1, 2)  # [B, Hkv, L, D]
        vc = self.kv_pool.v[layer][slots].transpose(1, 2)
        qb = q.unsqueeze(2)  # [B, Hq, 1, D]
        out = F.scaled_dot_product_attention(
            qb, kc.to(q.dtype), vc.to(q.dtype), attn_mask=valid, scale=self.scale, enable_gqa=True
        )
        return out.squeeze(2)

    def _extend(self, q, layer, fb):
        outs, start = [], 0
        for slots, pre, ext in zip(fb.attn_metadata, fb.prefix_lens_list, fb.extend_lens_list):
            qr = q[start : start + ext].transpose(0, 1)  # [Hq, E, D]
            kr = self.kv_pool.k[layer][slots].transpose(0, 1).to(q.dtype)  # [Hkv, S, D]
            vr = self.kv_pool.v[layer][slots].transpose(0, 1).to(q.dtype)
            qpos = torch.arange(pre, pre + ext, device=q.device).unsqueeze(1)
            kpos = torch.arange(pre + ext, device=q.device).unsqueeze(0)
            mask = kpos <= qpos  # [E, S]
            o = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=mask, scale=self.scale, enable_gqa=True)
            outs.append(o.transpose(0, 1))
            start += ext
        return torch.cat(outs, dim=0)
