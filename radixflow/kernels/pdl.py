"""Programmatic dependent launch (PDL) for the decode-path kernels, on Hopper and newer GPUs.

Normally a kernel starts only after the one before it in the stream has finished, so every
kernel boundary costs a drain and a ramp-up (about 1-2 us; a batch-1 decode step has ~300).
A kernel launched with PDL may be scheduled while its predecessor is still running. The
contract every such kernel keeps:

- before `gdc_wait()` it touches only memory no earlier kernel writes (model weights), so it
  can start streaming its weights early;
- it calls `gdc_wait()` (wait until the previous kernel has finished and its writes are
  visible) before its first other load and before any store, on every path;
- after the wait it calls `gdc_launch_dependents()`, which lets the next kernel be scheduled
  once all of this kernel's programs got that far.

Because each kernel waits for its predecessor, which waited for its own, a wait covers every
earlier kernel. Kernels launched without PDL (cuBLAS, torch) keep the ordinary stream order.
Do not fork a side stream inside such a chain: a CUDA graph captured with an L2-prefetch branch
joined back before a PDL kernel computed different logits (BENCHMARKS.md, session 4; not
understood, so not done).

In a kernel: a `USE_PDL: tl.constexpr` parameter and `pdl_wait(USE_PDL)` at the point above;
at the launch: `**pdl_launch(tensor)`, which sets both (or nothing on CPU / older GPUs).
`RADIXFLOW_PDL=0` turns it off; `set_enabled` does the same at run time (benchmarks).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

_enabled = os.environ.get("RADIXFLOW_PDL", "1") != "0"


def set_enabled(on: bool) -> bool:
    """Launch later kernels with (True) or without PDL; returns the previous setting. Already
    captured CUDA graphs keep what they were captured with."""
    global _enabled
    before, _enabled = _enabled, on
    return before


@functools.cache
def _device_supports(index: int) -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl_launch(t: torch.Tensor) -> dict:
    """Launch keywords for a kernel on t's device: {"USE_PDL": bool} plus launch_pdl when on."""
    on = _enabled and t.is_cuda and _device_supports(t.device.index or 0)
    return {"USE_PDL": True, "launch_pdl": True} if on else {"USE_PDL": False}


@triton.jit
def pdl_wait(USE_PDL: tl.constexpr):
    """Wait for the previous kernel, then let the next one be scheduled (see the module doc)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
