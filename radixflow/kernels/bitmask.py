"""Apply a packed token bitmask `[B, ceil(V/32)]` int32 to logits: bit j of word w
allows token 32*w + j; disallowed tokens get -inf.

`apply_token_bitmask` dispatches: the Triton kernel for CUDA tensors, the torch
reference otherwise (Triton is imported only on that path).
"""

from __future__ import annotations

import torch

_SHIFTS = {}


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, W] int32 -> [B, V] bool (True = allowed)."""
    key = bitmask.device
    if key not in _SHIFTS:
        _SHIFTS[key] = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> _SHIFTS[key]) & 1
    return bits.view(bitmask.shape[0], -1)[:, :vocab].bool()


def apply_token_bitmask_torch(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """In place, in plain torch (the reference)."""
    allowed = unpack_bitmask(bitmask, logits.shape[1])
    logits.masked_fill_(~allowed, float("-inf"))


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """In place: Triton on CUDA, torch elsewhere."""
    if logits.is_cuda and logits.stride(1) == 1:
        from radixflow.kernels.bitmask_triton import apply_token_bitmask_triton

        apply_token_bitmask_triton(logits, bitmask.to(logits.device, torch.int32))
        return
    apply_token_bitmask_torch(logits, bitmask)
