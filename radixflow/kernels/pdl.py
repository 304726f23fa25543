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
  call). `KernelSettings.pdl_early_trigger=False` (`--pdl-late-trigger`) puts it after the wait.

Because each kernel waits for its predecessor, which waited for its own, a wait covers every
earlier kernel, wherever the trigger sits: a kernel can only finish after its own wait returned.
Nor can early launches starve a kernel of SM slots: a kernel is launched only once every program
of its predecessor has started. Kernels launched without PDL (cuBLAS, torch) keep the ordinary
stream order.
Do not fork a side stream inside such a chain: a CUDA graph captured with an L2-prefetch branch
joined back before a PDL kernel computed different logits (not understood, so not done).

In a kernel: a `USE_PDL: tl.constexpr` parameter (0 off, 1 trigger after the wait, 2 before it)
and `pdl_wait(USE_PDL)` at the point above; at the launch: `**pdl_launch(tensor, settings)`, which sets
both from the engine's KernelSettings (or USE_PDL=0 alone on CPU / older GPUs).
`KernelSettings.pdl=False` (`--disable-pdl`) turns it off.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from radixflow import env
from radixflow.kernels.settings import KernelSettings


@functools.cache
def _device_supports(index: int) -> bool:
    if env.triton_interpret():
        return False
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl_launch(t: torch.Tensor, settings: KernelSettings) -> dict:
    """Launch keywords for a kernel on t's device: {"USE_PDL": 0, 1 or 2} plus launch_pdl when on."""
    on = settings.pdl and t.is_cuda and _device_supports(t.device.index or 0)
    return {"USE_PDL": 2 if settings.pdl_early_trigger else 1, "launch_pdl": True} if on else {"USE_PDL": 0}


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
