"""Prompt-only prefill passes whose rows all have one length, through torch's cuDNN attention (Hopper).

When every row of an extend pass is a fresh prompt of the same length L, the packed [T, H, D] q / k / v are
[B, H, L, D] views with no copy, and torch's SDPA on its cuDNN backend takes them as they are (grouped-query
heads included). On an H200 with Llama-3-8B heads it ran 1.83-2.07x FlashAttention-2 from 1 x 1,024 to 1 x 8,192
tokens (4 x 2,048: 260 against 488 us a layer; benchmarks/history/2026-12-03.md, session 12); its first call at a
new shape builds a graph (~41 ms). Ragged passes keep the flash kernel:
torch caches one cuDNN graph per shape and a variable-length graph's key holds the token count, so each new
pass would build one (so torch's source reads; not timed here). The dense graphs are keyed by (B, L): `CudnnShapes` bounds how many a process builds.
`cudnn_dense_supported` decides once, with a probe checked against plain attention.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from radixflow.kernels.flash_varlen import _probe_reference

MIN_LEN = 1024  # shorter rows: little attention time to save against a ~41 ms graph build per new shape (not timed)
MAX_SHAPES = 16  # distinct (B, L) a process builds graphs for (~0.7 s at most); later shapes keep the flash kernel


def cudnn_dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: int, length: int,
                          scale: float) -> torch.Tensor:
    """q: [rows * length, Hq, D], k/v: [rows * length, Hkv, D], request-major, each row a whole prompt; causal
    within each row -> [rows * length, Hq, D]."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    views = [t.view(rows, length, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(*views, is_causal=True, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out.transpose(1, 2).reshape(rows * length, q.shape[1], q.shape[2])


class CudnnShapes:
    """Which equal-length passes take cuDNN: rows of at least MIN_LEN tokens, in at most MAX_SHAPES (B, L)."""

    def __init__(self, max_shapes: int = MAX_SHAPES, min_len: int = MIN_LEN):
        self.seen: set[tuple[int, int]] = set()
        self.max_shapes, self.min_len = max_shapes, min_len

    def take(self, extend_lens: list[int]) -> tuple[int, int] | None:
        """(rows, length) if this pass of prompt-only rows takes cuDNN, else None."""
        length = extend_lens[0]
        if length < self.min_len or any(n != length for n in extend_lens):
            return None
        shape = (len(extend_lens), length)
        if shape not in self.seen:
            if len(self.seen) >= self.max_shapes:
                return None
            self.seen.add(shape)
        return shape


@functools.lru_cache(maxsize=None)
def cudnn_dense_supported(device: str, num_q_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """Whether this torch and device run `cudnn_dense_attention` for these heads (bf16) where it was timed
    (compute capability 9.x), checked once on strided views of a packed qkv, as the model passes them: the
    backend missing, refusing the shape, or disagreeing with plain attention -> False."""
    dev = torch.device(device)
    if dev.type != "cuda" or torch.cuda.get_device_capability(dev)[0] != 9:
        return False
    rows, length = 2, 64
    g = torch.Generator(device=dev).manual_seed(0)
    qkv = torch.randn(rows * length, (num_q_heads + 2 * num_kv_heads) * head_dim, device=dev, generator=g,
                      dtype=torch.bfloat16)
    q, k, v = qkv.split([num_q_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    q, k, v = (t.view(rows * length, -1, head_dim) for t in (q, k, v))
    scale = head_dim**-0.5
    try:
        got = cudnn_dense_attention(q, k, v, rows, length, scale)
    except RuntimeError:  # no cuDNN attention in this torch, or it refuses this layout
        return False
    err = (got.float() - _probe_reference(q, k, v, [length] * rows, scale)).abs().max().item()
    return err < 2e-2
