"""Causal attention of prompt-only rows through torch's packed variable-length flash kernel.

A request with no cached prefix attends only to its own new tokens, so its K/V can be read
straight from the step's projections instead of through the paged pool: the packed batch plus
the cumulative row lengths is what FlashAttention-2's variable-length forward takes. Grouped-query
heads are passed as they are (the kernel maps each query head to its KV head; nothing is copied).
torch ships that kernel as `aten._flash_attention_forward` on CUDA (sm80 and newer, fp16/bf16,
head_dim a multiple of 8 up to 256). `flash_varlen_supported` decides once, with a small probe
checked against plain attention, so a step never pays for a try/except.
"""

from __future__ import annotations

import functools

import torch

FLASH_DTYPES = (torch.float16, torch.bfloat16)


def flash_varlen_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int, scale: float
) -> torch.Tensor:
    """q: [T, Hq, D], k/v: [T, Hkv, D] packed request-major; cu_seqlens: int32 [B + 1] row starts and T.
    Each row attends causally to its own tokens only -> [T, Hq, D]."""
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, 0.0, True, False, scale=scale
    )
    return out[0]


def _probe_reference(q, k, v, lens: list[int], scale: float) -> torch.Tensor:
    """Plain causal attention per row, float32 (the probe's yardstick)."""
    group = q.shape[1] // k.shape[1]
    outs, start = [], 0
    for n in lens:
        qs, ks, vs = (x[start : start + n].float().transpose(0, 1) for x in (q, k, v))
        ks, vs = ks.repeat_interleave(group, 0), vs.repeat_interleave(group, 0)
        s = (qs @ ks.transpose(1, 2)) * scale
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        outs.append((s.softmax(-1) @ vs).transpose(0, 1))
        start += n
    return torch.cat(outs)


@functools.lru_cache(maxsize=None)
def flash_varlen_supported(device: str, num_q_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """Whether this torch and device run `flash_varlen_attention` for these heads (bf16), checked once by a
    probe on a ragged batch: the op missing, refusing the shape, or disagreeing with plain attention -> False."""
    dev = torch.device(device)
    if dev.type != "cuda" or not hasattr(torch.ops.aten, "_flash_attention_forward"):
        return False
    if torch.cuda.get_device_capability(dev) < (8, 0) or head_dim % 8 or head_dim > 256:
        return False
    lens = [5, 17, 1]
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(sum(lens), h, head_dim, device=dev, generator=g, dtype=torch.bfloat16)
               for h in (num_q_heads, num_kv_heads, num_kv_heads))
    cu = torch.tensor([0, 5, 22, 23], dtype=torch.int32, device=dev)
    scale = head_dim**-0.5
    try:
        got = flash_varlen_attention(q, k, v, cu, max(lens), scale)
    except RuntimeError:  # the op refuses this device, dtype or head layout
        return False
    err = (got.float() - _probe_reference(q, k, v, lens, scale)).abs().max().item()
    return err < 2e-2
