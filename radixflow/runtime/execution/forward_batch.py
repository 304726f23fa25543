"""What one forward pass needs: token ids, positions and the KV layout, as tensors.

Attention backends read only this (plus their own metadata, set by
`init_forward_metadata`), so Triton / FlashInfer backends plug in without touching
the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

import torch


class ForwardMode(Enum):
    EXTEND = "extend"  # new tokens attend to a cached prefix plus causally to themselves
    DECODE = "decode"  # one new token per request; every row's logits (logits_indices is arange(B))


@dataclass
class ForwardBatch:
    mode: ForwardMode
    input_ids: torch.Tensor  # [T] int64, all new tokens of the batch, request-major
    positions: torch.Tensor  # [T] int64
    out_cache_loc: torch.Tensor  # [T] int64 KV slots for the new tokens
    req_pool_indices: torch.Tensor  # [B] int64 rows of req_to_token
    seq_lens: torch.Tensor  # [B] int64 KV length after this pass
    prefix_lens: torch.Tensor  # [B] int64 KV length before this pass
    extend_lens: torch.Tensor  # [B] int64 new tokens per request
    logits_indices: torch.Tensor  # [N] rows of the hidden states that need logits
    seq_lens_list: list = field(default_factory=list)  # host copies, to avoid syncs
    prefix_lens_list: list = field(default_factory=list)
    extend_lens_list: list = field(default_factory=list)
    attn_metadata: Optional[Any] = None

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_list)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())
