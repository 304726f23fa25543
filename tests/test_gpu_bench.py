"""benchmarks/gpu_bench.py's section loop on the CPU, without running a section."""

from __future__ import annotations

import json
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


def test_sections_past_the_deadline_are_saved_as_skipped(tmp_path, monkeypatch):
    """--deadline-s counts from the script's start (here: this module's import, long past 1 ms), so every
    section is skipped; each skip reaches results.json, a repeated section under its own key."""
    monkeypatch.syspath_prepend(BENCH)
    import gpu_bench
    from gpubench.common import RESULTS

    ran = []
    monkeypatch.setitem(gpu_bench.SECTIONS, "env", lambda: ran.append("env") or {})
    argv = ["gpu_bench.py", "--smoke", "--out", str(tmp_path), "--deadline-s", "0.001", "--sections", "env,bs1,bs1"]
    monkeypatch.setattr(sys, "argv", argv)
    RESULTS.clear()
    try:
        gpu_bench.main()
    finally:
        RESULTS.clear()
    saved = json.loads((tmp_path / "results.json").read_text())
    assert ran == []
    assert set(saved) == {"env", "bs1", "bs1#1"}
    assert all(v == {"skipped": "--deadline-s 0.001 passed"} for v in saved.values())


def test_sections_before_the_deadline_run(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(BENCH)
    import gpu_bench
    from gpubench.common import RESULTS

    monkeypatch.setitem(gpu_bench.SECTIONS, "env", lambda: {"ok": 1})
    argv = ["gpu_bench.py", "--smoke", "--out", str(tmp_path), "--deadline-s", "1e6", "--sections", "env,env"]
    monkeypatch.setattr(sys, "argv", argv)
    RESULTS.clear()
    try:
        gpu_bench.main()
    finally:
        RESULTS.clear()
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["env"] == saved["env#1"] == {"ok": 1}
    assert "env_wall_s" in saved and "env#1_wall_s" in saved
