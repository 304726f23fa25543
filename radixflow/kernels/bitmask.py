"""Apply a packed token bitmask `[B, ceil(V/32)]` int32 to logits: bit j of word w
allows token 32*w + j; disallowed tokens get -inf.

`apply_token_bitmask` dispatches: the Triton kernel for CUDA tensors, the torch
reference otherwise (Triton is imported only on that path).
"""

from __future__ import annotations

import sys
from collections import OrderedDict

import torch
import torch.nn.functional as F

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


_BYTE_BIAS = {}


def _byte_bias(device, dtype) -> torch.Tensor:
    """[256, 8]: entry (b, i) is 0 if bit i of byte b is set, else -inf."""
    key = (device, dtype)
    if key not in _BYTE_BIAS:
        bits = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
        _BYTE_BIAS[key] = torch.zeros(256, 8, dtype=dtype).masked_fill_(bits == 0, float("-inf")).to(device)
    return _BYTE_BIAS[key]


def apply_token_bitmask_lut(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """In place, fast on CPU: each mask byte looks up its 8 additive biases (0 / -inf) in a
    256-row table, then one add. `masked_fill_` with an unpacked bool mask is ~5x slower there.
    Reads the int32 words as little-endian bytes (byte k of word w = tokens 32w+8k..32w+8k+7)."""
    assert sys.byteorder == "little"
    b, vocab = logits.shape
    by = bitmask.contiguous().view(torch.uint8).long()
    bias = F.embedding(by, _byte_bias(logits.device, logits.dtype)).view(b, -1)
    logits.add_(bias[:, :vocab])


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """In place: Triton on CUDA, the byte-table version elsewhere."""
    if logits.is_cuda and logits.stride(1) == 1:
        from radixflow.kernels.bitmask_triton import apply_token_bitmask_triton

        apply_token_bitmask_triton(logits, bitmask.to(logits.device, torch.int32))
        return
    apply_token_bitmask_lut(logits, bitmask.to(logits.device, torch.int32))


class BiasRowCache:
    """Additive bias rows (0 / -inf over the vocabulary) of recently used masks, so a
    small CPU batch applies its mask with one add. Keyed by the mask array's id(): grammar
    masks are cached arrays that live as long as their grammar, and each entry holds its
    mask, so the id cannot be reused while the entry exists. LRU-bounded (~200 KB a row)."""

    def __init__(self, capacity: int = 64):
        self.capacity = capacity
        self.rows: OrderedDict = OrderedDict()

    def get(self, mask, vocab: int) -> torch.Tensor:
        key = (id(mask), vocab)
        hit = self.rows.get(key)
        if hit is not None:
            self.rows.move_to_end(key)
            return hit[1]
        row = torch.zeros(1, vocab)
        apply_token_bitmask_lut(row, torch.from_numpy(mask).view(1, -1))
        self.rows[key] = (mask, row[0])
        if len(self.rows) > self.capacity:
            self.rows.popitem(last=False)
        return row[0]
