"""Row-wise argmax of logits [B, V] in two passes, for greedy sampling.

torch.argmax reduces each row inside one thread block: over a 128k vocabulary that leaves
most of the GPU idle and took longer than all the other work outside a batch-1 decode step's
CUDA graph together. Stage 1 splits every row over many programs, each keeping its
block's maximum and the first index holding it; stage 2 takes, per row, the lowest such
index among the blocks that hold the row's maximum. Ties go to the lowest index, as in
torch.argmax; NaN counts as +inf (torch ranks NaN above everything, so a row holding both
can differ). Reference: torch.argmax.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_V = 4096  # vocabulary entries per stage-1 program


@triton.jit
def _argmax_blocks(X, Val, Idx, V, stride_x, num_blocks, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + row * stride_x + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    x = tl.where(x != x, float("inf"), x)  # NaN
    best = tl.max(x, axis=0)
    first = tl.min(tl.where(x == best, offs, V), axis=0)
    tl.store(Val + row * num_blocks + blk, best)
    tl.store(Idx + row * num_blocks + blk, first)


@triton.jit
def _argmax_rows(Val, Idx, Out, num_blocks, BLOCK_B: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_B)
    mask = offs < num_blocks
    val = tl.load(Val + row * num_blocks + offs, mask=mask, other=float("-inf"))
    idx = tl.load(Idx + row * num_blocks + offs, mask=mask, other=2**31 - 1)
    best = tl.max(val, axis=0)
    tl.store(Out + row, tl.min(tl.where(mask & (val == best), idx, 2**31 - 1), axis=0).to(tl.int64))


def argmax_rows(logits: torch.Tensor, block: int = BLOCK_V) -> torch.Tensor:
    """logits [B, V] (unit stride in V) -> [B] int64, like logits.argmax(dim=-1) (see the module doc)."""
    assert logits.dim() == 2 and logits.stride(1) == 1
    rows, vocab = logits.shape
    if rows == 0 or vocab <= block:  # one block a row: torch's single reduction is as parallel
        return logits.argmax(dim=-1)
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    blocks = triton.cdiv(vocab, block)
    val = torch.empty((rows, blocks), dtype=torch.float32, device=logits.device)
    idx = torch.empty((rows, blocks), dtype=torch.int32, device=logits.device)
    _argmax_blocks[(rows, blocks)](logits, val, idx, vocab, logits.stride(0), blocks, BLOCK=block, num_warps=8)
    _argmax_rows[(rows,)](val, idx, out, blocks, BLOCK_B=triton.next_power_of_2(blocks), num_warps=1)
    return out
