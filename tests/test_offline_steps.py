"""benchmarks/offline_steps.py's split of the offline decode steps, on made-up steps (no model, no GPU)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

from offline_steps import band_table, steps_of, tile_fits  # noqa: E402


def _steps(tile: int, per_row: float, per_1k_kv: float, fixed: float) -> list:
    """Steps whose time is fixed + per_row * (batch rounded up to `tile`) + per_1k_kv * KV tokens / 1000."""
    rng = np.random.default_rng(0)
    rows = []
    for bs in range(1000, 0, -3):
        kv = int(bs * rng.integers(300, 900))
        rows.append((bs, kv, fixed + per_row * np.ceil(bs / tile) * tile + per_1k_kv * kv / 1e3))
    return rows


def test_the_fit_finds_the_tile_and_the_costs():
    fits = tile_fits(np.array(_steps(128, 0.016, 0.028, 2.0)), min_bs=300)
    best = min(fits, key=lambda t: fits[t][0])
    assert best == 128
    rms, fixed, per_row, per_kv = fits[128]
    assert rms < 1e-9 and fixed == pytest.approx(2.0) and per_row == pytest.approx(0.016) and per_kv == pytest.approx(0.028)
    assert fits[1][0] > 0.1  # the batch as is does not explain tile-rounded steps


def test_paired_arms_give_per_band_differences():
    results = {"offline": {"seed2024": {"decode_steps_bs_ctx_ms": _steps(1, 0.023, 0.034, 2.8)}},
               "offline@fp8": {"seed2024": {"decode_steps_bs_ctx_ms": _steps(128, 0.016, 0.034, 2.2)}}}
    arms = {n: steps_of(results, n) for n in results}
    lines = band_table(arms)
    assert lines[0].startswith("| batch | steps |") and "offline - offline@fp8" in lines[0]
    top = next(line for line in lines if line.startswith("| 769-1024 |")).split("|")
    bf16_ms, fp8_ms, diff = float(top[5]), float(top[6]), float(top[7])
    assert bf16_ms > fp8_ms and diff == pytest.approx(bf16_ms - fp8_ms, abs=0.011)
    assert lines[-1].startswith("| all | 334 |")
