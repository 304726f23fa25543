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


def cuda_queued_s(fn, reps: int = 20, rounds: int = 3) -> float:
    """GPU seconds per fn() call, host launch time left out: the calls are queued behind a sleeping
    kernel, so the GPU runs them back to back (best of `rounds`). fn must not wait for the GPU."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(300_000_000)  # ~0.15 s of GPU cycles: longer than queueing the calls
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / reps)
    return best
