"""Small all-reduces through PyTorch's symmetric memory (`--enable-one-shot-allreduce`, CUDA).

A decode step all-reduces two `[batch, hidden]` tensors a layer; at small batches each is a few
KB, where latency, not bandwidth, sets the cost. With this on, an all-reduce that fits the
buffer (the largest CUDA-graph batch's hidden states) copies its input into one symmetric-memory
buffer every rank can read over NVLink, and `one_shot_all_reduce_out` has each rank read and add
every peer's copy in one kernel, which a CUDA graph captures like any other (the kernel's own
barriers make reusing the buffer for the next all-reduce safe). Larger all-reduces (prefill)
stay on NCCL. Multicast stays off (TORCH_SYMM_MEM_DISABLE_MULTICAST=1 unless the environment
says otherwise), as benchmarks/allreduce_bench.py measured it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass
class OneShotAllReduce:
    buffer: torch.Tensor  # uint8, symmetric memory, `max_bytes` long
    group_name: str
    max_bytes: int

    def fits(self, x: torch.Tensor) -> bool:
        return x.is_cuda and x.numel() * x.element_size() <= self.max_bytes

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        staged = self.buffer[: x.numel() * x.element_size()].view(x.dtype)  # offset 0: the symmetric allocation
        staged.copy_(x.reshape(-1))
        out = torch.empty_like(x)
        torch.ops.symm_mem.one_shot_all_reduce_out(staged, "sum", self.group_name, out.view(-1))
        return out


def make_one_shot(device_group, max_bytes: int) -> OneShotAllReduce:
    """Collective: every rank calls it with the same `max_bytes`."""
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    import torch.distributed._symmetric_memory as symm_mem

    max_bytes = -(-max_bytes // 16) * 16
    buffer = symm_mem.empty(max_bytes, device="cuda", dtype=torch.uint8)
    symm_mem.rendezvous(buffer, device_group.group_name)
    return OneShotAllReduce(buffer, device_group.group_name, max_bytes)
