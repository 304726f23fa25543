"""benchmarks/offline_steps.py's split of the offline decode steps, on made-up steps (no model, no GPU)."""

from __future__ import annotations

import json
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


def _band_mean(rows: list, lo: int, hi: int, tile: int, per_row: float, per_1k_kv: float, fixed: float) -> float:
    """The planted cost of the band's steps, from the formula (not from the step times)."""
    return float(np.mean([fixed + per_row * np.ceil(bs / tile) * tile + per_1k_kv * kv / 1e3
                          for bs, kv, _ in rows if lo <= bs <= hi]))


def test_paired_arms_give_per_band_means_and_differences():
    bf16, fp8 = (1, 0.023, 0.034, 2.8), (128, 0.016, 0.034, 2.2)
    results = {"offline": {"seed2024": {"decode_steps_bs_kv_ms": _steps(*bf16)}},
               "offline@fp8": {"seed2024": {"decode_steps_bs_ctx_ms": _steps(*fp8)}}}  # the key's former name
    arms = {n: steps_of(results, n) for n in results}
    lines = band_table(arms)
    assert lines[0].startswith("| batch | steps |") and "offline - offline@fp8" in lines[0]
    rows = _steps(*bf16)
    for lo, hi in ((65, 256), (769, 1024)):
        cells = next(line for line in lines if line.startswith(f"| {lo}-{hi} |")).split("|")
        assert int(cells[2]) == sum(lo <= bs <= hi for bs, _, _ in rows)
        want_bf16, want_fp8 = _band_mean(rows, lo, hi, *bf16), _band_mean(rows, lo, hi, *fp8)
        assert float(cells[5]) == pytest.approx(want_bf16, abs=0.006)
        assert float(cells[6]) == pytest.approx(want_fp8, abs=0.006)
        assert float(cells[7]) == pytest.approx(want_bf16 - want_fp8, abs=0.006)
    assert lines[-1].startswith("| all | 334 |")


def test_the_script_takes_the_arms_it_is_given(tmp_path, capsys, monkeypatch):
    import offline_steps

    steps = _steps(128, 0.016, 0.028, 2.0)
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"offline_1k@fp8": {"decode_steps_bs_kv_ms": steps, "out_tok_s": 1.0},
                                "offline_arms": {"base": {"seed2024": {"decode_steps_bs_kv_ms": steps}}}}))
    monkeypatch.setattr(sys, "argv", ["offline_steps.py", str(path), "--arms", "offline_1k@fp8,offline_1k@fp8kv8"])
    offline_steps.main()
    out = capsys.readouterr().out
    assert "left out: offline_1k@fp8kv8" in out and "| batch | steps | mean batch | KV tokens (k) | offline_1k@fp8 ms |" in out
    monkeypatch.setattr(sys, "argv", ["offline_steps.py", str(path), "--arms", "offline_arms/base,offline_1k@fp8"])
    offline_steps.main()  # an arm inside a section of several arms
    assert "| offline_arms/base ms | offline_1k@fp8 ms |" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["offline_steps.py", str(path)])  # the default arms are not in this run
    with pytest.raises(SystemExit, match="has per-step records"):
        offline_steps.main()
