"""Triton grammar-bitmask apply: disallowed tokens' logits become -inf, in place.

Bit j of word w allows token 32*w + j. Only the disallowed entries are written; the
logits are never read. Reference: `bitmask.apply_token_bitmask_torch`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096


@triton.jit
def _bitmask_kernel(Logits, Mask, stride_l, stride_m, V, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < V
    words = tl.load(Mask + row * stride_m + offs // 32, mask=valid, other=-1)
    banned = ((words >> (offs % 32)) & 1) == 0
    ninf = tl.full([BLOCK], float("-inf"), Logits.dtype.element_ty)
    tl.store(Logits + row * stride_l + offs, ninf, mask=valid & banned)


def apply_token_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """logits: [B, V] (unit stride in V); bitmask: [B, ceil(V/32)] int32."""
    rows, vocab = logits.shape
    assert logits.stride(1) == 1 and bitmask.dtype == torch.int32 and bitmask.shape[0] == rows
    if rows:
        grid = (rows, triton.cdiv(vocab, BLOCK))
        _bitmask_kernel[grid](logits, bitmask, logits.stride(0), bitmask.stride(0), vocab, BLOCK=BLOCK, num_warps=8)
