"""Programmatic dependent launch (PDL) for the decode-path kernels, on Hopper and newer GPUs.

Normally a kernel starts only after the one before it in the stream has finished, so every
kernel boundary costs a drain and a ramp-up (about 1-2 us; a batch-1 decode step has ~300).
A kernel launched with PDL may be scheduled while its predecessor is still running. The
contract every such kernel keeps:

- before `gdc_wait()` it touches only memory no earlier kernel writes (model weights), so it
  can start streaming its weights early;
- it calls `gdc_wait()` (wait until the previous kernel has finished and its writes are
  visible) before its first other load and before any store, on every path;
- it calls `gdc_launch_dependents()`, which lets the next kernel be scheduled once all of this
  kernel's programs got that far. By default that call comes *before* the wait ("early
  trigger"), so the next kernel's programs take free SM slots and start streaming their weights
  while this kernel still waits on the one before it (the tail of a GEMV, a whole attention
  call). `RADIXFLOW_PDL_EARLY=0` (or `set_early_trigger(False)`) puts it after the wait.

Because each kernel waits for its predecessor, which waited for its own, a wait covers every
earlier kernel, wherever the trigger sits: a kernel can only finish after its own wait returned.
Nor can early launches starve a kernel of SM slots: a kernel is launched only once every program
of its predecessor has started. Kernels launched without PDL (cuBLAS, torch) keep the ordinary
stream order.
Do not fork a side stream inside such a chain: a CUDA graph captured with an L2-prefetch branch
joined back before a PDL kernel computed different logits (BENCHMARKS.md, session 4; not
understood, so not done).

In a kernel: a `USE_PDL: tl.constexpr` parameter (0 off, 1 trigger after the wait, 2 before it)
and `pdl_wait(USE_PDL)` at the point above; at the launch: `**pdl_launch(tensor)`, which sets
both (or USE_PDL=0 alone on CPU / older GPUs).
`RADIXFLOW_PDL=0` turns it off; `set_enabled` does the same at run time (benchmarks).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

_enabled = os.environ.get("RADIXFLOW_PDL", "1") != "0"
_early = os.environ.get("RADIXFLOW_PDL_EARLY", "1") != "0"


def set_enabled(on: bool) -> bool:
    """Launch later kernels with (True) or without PDL; returns the previous setting. Already
    captured CUDA graphs keep what they were captured with."""
    global _enabled
    before, _enabled = _enabled, on
    return before


def set_early_trigger(on: bool) -> bool:
    """Trigger the next kernel before (True) or after the wait in kernels launched from now on;
    returns the previous setting. Captured CUDA graphs keep what they were captured with."""
    global _early
    before, _early = _early, on
    return before


@functools.cache
def _device_supports(index: int) -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl_launch(t: torch.Tensor) -> dict:
    """Launch keywords for a kernel on t's device: {"USE_PDL": 0, 1 or 2} plus launch_pdl when on."""
    on = _enabled and t.is_cuda and _device_supports(t.device.index or 0)
    return {"USE_PDL": 2 if _early else 1, "launch_pdl": True} if on else {"USE_PDL": 0}


@triton.jit
def pdl_wait(USE_PDL: tl.constexpr):
    """Wait for the previous kernel and let the next one be scheduled, in the order USE_PDL says
    (see the module doc)."""
    if USE_PDL == 2:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    elif USE_PDL == 1:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
