"""The environment variables radixflow reads, in one place, each with its type and default.

Everything else is configured through `ServerArgs` (and, for kernels, the `KernelSettings`
derived from it). These are read when something is built, never per step.
"""

from __future__ import annotations

import os
from typing import Optional


def cache_dir() -> str:
    """RADIXFLOW_CACHE: where converted GGUF models are kept (default ~/.cache/radixflow)."""
    return os.environ.get("RADIXFLOW_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "radixflow"))


def tp_check_every(default: int) -> int:
    """RADIXFLOW_TP_CHECK_EVERY: under tensor parallelism, compare the ranks' request tables
    every this many passes (at least 1)."""
    return max(int(os.environ.get("RADIXFLOW_TP_CHECK_EVERY", default)), 1)


def test_fault_rid_prefix() -> Optional[str]:
    """RADIXFLOW_TEST_FAULT_RID_PREFIX (tests only): a forward pass touching a request whose rid
    starts with it raises, to exercise the server's error path."""
    return os.environ.get("RADIXFLOW_TEST_FAULT_RID_PREFIX") or None


TP_DIVERGE_RID_PREFIX = "RADIXFLOW_TEST_TP_DIVERGE_RID_PREFIX"


def test_tp_diverge_rid_prefix() -> Optional[str]:
    """RADIXFLOW_TEST_TP_DIVERGE_RID_PREFIX (tests only): tensor-parallel ranks > 0 drop the requests
    whose rid starts with it, to exercise the detection of a rank that diverges."""
    return os.environ.get(TP_DIVERGE_RID_PREFIX) or None


def triton_interpret() -> bool:
    """TRITON_INTERPRET=1: Triton kernels run in Triton's CPU interpreter (no PDL, no GPU)."""
    return os.environ.get("TRITON_INTERPRET") == "1"
