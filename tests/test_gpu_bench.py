"""benchmarks/gpu_bench.py's section loop on the CPU, without running a real section."""

from __future__ import annotations

import json
import os
import sys
import time

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


def _run(tmp_path, monkeypatch, env_section, *args: str) -> dict:
    """gpu_bench.main(), begun a second ago, with `env_section` in place of the env section; the
    results.json it saved."""
    monkeypatch.syspath_prepend(BENCH)
    import gpu_bench
    from gpubench.common import RESULTS

    monkeypatch.setattr(gpu_bench, "START", time.perf_counter() - 1.0)
    monkeypatch.setitem(gpu_bench.SECTIONS, "env", env_section)
    monkeypatch.setattr(sys, "argv", ["gpu_bench.py", "--smoke", "--out", str(tmp_path), *args])
    RESULTS.clear()
    try:
        gpu_bench.main()
    finally:
        RESULTS.clear()
    return json.loads((tmp_path / "results.json").read_text())


def test_sections_past_the_deadline_are_saved_as_skipped(tmp_path, monkeypatch):
    """Every section would start past the deadline: each skip reaches results.json, a repeated section
    under its own key."""
    ran = []
    saved = _run(tmp_path, monkeypatch, lambda: ran.append("env") or {}, "--deadline-s", "0.5", "--sections", "env,bs1,bs1")
    assert ran == []
    assert set(saved) == {"env", "bs1", "bs1#1"}
    assert all(v == {"skipped": "--deadline-s 0.5 passed"} for v in saved.values())


def test_sections_before_the_deadline_run(tmp_path, monkeypatch):
    saved = _run(tmp_path, monkeypatch, lambda: {"ok": 1}, "--deadline-s", "600", "--sections", "env,env")
    assert saved["env"] == saved["env#1"] == {"ok": 1}
    assert "env_wall_s" in saved and "env#1_wall_s" in saved


def test_offline_skips_later_seeds_past_the_deadline(monkeypatch):
    """The first seed is the section's figure and always runs; later seeds past --deadline-s are recorded
    as skipped and left out of the median."""
    monkeypatch.syspath_prepend(BENCH)
    from gpubench import offline
    from gpubench.common import OPTS

    monkeypatch.setattr(offline, "offline_requests", lambda seed: [None] * (seed - 2000))
    monkeypatch.setattr(offline, "_offline_pass", lambda eng, reqs, steps=False: {"out_tok_s": float(len(reqs))})
    opts = dict(bench_engine=None, offline_seeds="2024,2025,2026", offline_warmup=0, deadline_s=0.5,
                start=time.perf_counter() - 1.0)
    for name, value in opts.items():
        monkeypatch.setattr(OPTS, name, value, raising=False)
    res = offline.sec_offline()
    assert res["seed2024"] == {"out_tok_s": 24.0}
    assert res["seed2025"] == res["seed2026"] == {"skipped": "past --deadline-s"}
    assert res["out_tok_s"] == res["out_tok_s_min"] == res["out_tok_s_max"] == 24.0
    monkeypatch.setattr(OPTS, "deadline_s", 600)
    assert offline.sec_offline()["out_tok_s"] == 25.0  # in time: all three seeds, their median
