"""Copies between host and GPU that never make the host wait for the GPU.

A copy from pageable host memory may first synchronize with the stream (CUDA stages pageable
memory through pinned buffers; its documentation allows the sync), which stalls a scheduler
that prepares the next pass while the current one runs. Copying from pinned memory is truly
asynchronous; PyTorch's pinned-memory cache keeps the source alive until the copy has run.
"""

from __future__ import annotations

from typing import Optional

import torch


def to_device_async(t: torch.Tensor, device) -> torch.Tensor:
    """`t` (on the host) on `device`, queued on the current stream without waiting for the GPU."""
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def copy_to_host(t: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.cuda.Event]]:
    """Start copying `t` (a pass's results) to the host without waiting; the copy is valid once the
    returned event has completed (None on the CPU, where it already is). A non-blocking copy to the
    CPU lands in pinned memory, so it is truly asynchronous."""
    host = t.to("cpu", non_blocking=True)
    if not t.is_cuda:
        return host, None
    ready = torch.cuda.Event()
    ready.record()
    return host, ready
