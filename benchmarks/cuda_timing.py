"""Median GPU time of a call, by CUDA events (shared by the GPU benchmarks)."""

from __future__ import annotations

import statistics

import torch


def cuda_median_s(fn, reps: int, warmup: int = 0) -> float:
    """Median seconds of fn() over `reps` calls, each between two CUDA events, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)
