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


def test_offline_decode_ab_runs_each_arm_under_its_entry_and_restores_it(tmp_path, monkeypatch):
    """offline_decode_ab: every pass of the `entry` arm runs with --decode-entry's entry in DECODE_CONFIG, the
    others with the entry as built; the graphs are captured again only when the entry changes; the entry as
    built is back afterwards. Without a file the second arm is an A/A."""
    monkeypatch.syspath_prepend(BENCH)
    from types import SimpleNamespace

    from gpubench import offline
    from gpubench.common import OPTS, RESULTS
    from radixflow.kernels import decode_attention as da

    built, entry = da.DECODE_CONFIG["bf16"], {"num_warps": 8, "min_batch": 2}
    path = tmp_path / "best.json"
    path.write_text(json.dumps({"entry": entry}))
    seen, recaptures = [], []
    runner = SimpleNamespace(settings=None, set_kernel_settings=lambda s: recaptures.append(da.DECODE_CONFIG["bf16"]))
    monkeypatch.setattr(offline, "offline_requests", lambda seed: [seed])
    monkeypatch.setattr(offline, "_offline_pass", lambda eng, reqs, steps=False: seen.append(
        (reqs[0] if reqs else None, da.DECODE_CONFIG["bf16"])) or {"out_tok_s": 1.0})
    monkeypatch.setattr(offline, "save", lambda: None)
    opts = dict(bench_engine=SimpleNamespace(runner=runner), offline_seeds="2024,2025", offline_warmup=0,
                deadline_s=600, start=time.perf_counter(), decode_entry=str(path), section_key="offline_decode_ab")
    for name, value in opts.items():
        monkeypatch.setattr(OPTS, name, value, raising=False)
    try:
        res = offline.sec_offline_decode_ab()
    finally:
        RESULTS.clear()
    assert set(res) == {"decode_entry", "default", "entry", "default_2", "entry_2"} and res["decode_entry"] == entry
    # per arm: the cold pass, then seeds 2024 and 2025; then each arm on 2024 again
    arm = [(2024, built), (2024, built), (2025, built)]
    assert seen == arm + [(s, entry) for s, _ in arm] + [(2024, built), (2024, entry)]
    assert recaptures == [entry, built, entry, built] and da.DECODE_CONFIG["bf16"] == built
    monkeypatch.setattr(OPTS, "decode_entry", str(tmp_path / "missing.json"))
    seen.clear()
    assert "default_again" in offline.sec_offline_decode_ab() and all(e == built for _, e in seen)
    RESULTS.clear()


def test_attention_bench_baselines_name_the_launch_they_run(monkeypatch):
    """fp8_attn_bench's 4-warp baselines stay 4-warp launches where DECODE_CONFIG's `bf16` entry applies (batch
    256 and up at Llama-3-8B heads; on the CPU every device gate passes), `bf16` is the entry's launch, and every
    `bf16_*` sweep label is the launch its config resolves to."""
    monkeypatch.syspath_prepend(BENCH)
    import fp8_attn_bench as fab
    import gpu_attn_bench as attn

    for bs in (256, 512):
        assert attn.launch_label(bs, fab.LAUNCHES["bf16_4w"][1]) == "n64w4s3"
        assert attn.launch_label(bs, fab.LAUNCHES["bf16"][1]) == "n64w2s3"  # DECODE_CONFIG's `bf16` entry
        for lab in ("fp8_bf16_launch", "fp8_bf16_launch_v_regs"):
            assert attn.launch_label(bs, fab.LAUNCHES[lab][1], "fp8") == "n64w4s3", lab
        extra = [(lab, cfg) for lab, fp8, cfg in fab.variants("^bf16_n") if lab.startswith("bf16_n")]
        assert extra and all(lab == "bf16_" + attn.launch_label(bs, cfg) for lab, cfg in extra), extra
