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


def test_offline_decode_ab_runs_no_entry_then_the_entry_and_restores_it(tmp_path, monkeypatch):
    """offline_decode_ab: every pass of the `no_entry` arm runs with no `bf16` entry in DECODE_CONFIG and every
    pass of the `entry` arm with --decode-entry's (without the flag: DECODE_CONFIG's own), whatever DECODE_CONFIG
    held; the graphs are captured again only when the entry changes; DECODE_CONFIG's entry is back afterwards. A
    missing file, an empty or null entry and a misspelt key are refused before any pass."""
    monkeypatch.syspath_prepend(BENCH)
    from types import SimpleNamespace

    import pytest
    from gpubench import offline
    from gpubench.common import OPTS, RESULTS
    from radixflow.kernels import decode_attention as da

    built, entry = da.DECODE_CONFIG["bf16"], {"num_warps": 8, "min_batch": 2}
    assert built, "DECODE_CONFIG has a `bf16` entry (the flag-less run times it)"
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
        for flag, want in ((str(path), entry), ("", built)):
            monkeypatch.setattr(OPTS, "decode_entry", flag)
            seen.clear(), recaptures.clear()
            res = offline.sec_offline_decode_ab()
            assert set(res) == {"decode_entry", "no_entry", "entry", "no_entry_2", "entry_2"}
            assert res["decode_entry"] == want
            # per arm: the cold pass, then seeds 2024 and 2025; then each arm on 2024 again
            arm = [(2024, {}), (2024, {}), (2025, {})]
            assert seen == arm + [(s, want) for s, _ in arm] + [(2024, {}), (2024, want)]
            assert recaptures == [{}, want, {}, want] + ([] if want == built else [built])
            assert da.DECODE_CONFIG["bf16"] == built
        for body, match in (({"entry": {"num_warp": 2}}, "bf16.num_warp"), ({"entry": None}, "not an entry"),
                            ({"entry": {}}, "not an entry"), ({}, "not an entry")):
            path.write_text(json.dumps(body))
            with pytest.raises(ValueError, match=match):
                offline.decode_entry(str(path))
        with pytest.raises(ValueError, match="no such file"):
            offline.decode_entry(str(tmp_path / "missing.json"))
    finally:
        RESULTS.clear()


def test_gpu_bench_refuses_a_missing_decode_entry_before_any_section(tmp_path, monkeypatch, capsys):
    import pytest

    with pytest.raises(SystemExit):
        _run(tmp_path, monkeypatch, lambda: {}, "--sections", "offline_decode_ab",
             "--decode-entry", str(tmp_path / "missing.json"))
    assert "no such file" in capsys.readouterr().err and not (tmp_path / "results.json").exists()


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


def test_bf16_sweep_writes_the_entry_gated_on_what_it_timed(monkeypatch):
    """bf16_attn_bench.entry_for: the winning launch's keys over DECODE_CONFIG's top level, gated on the sweep's
    batch, head size, KV heads and GPU; the same whatever DECODE_CONFIG's `bf16` entry is when the sweep runs;
    None when the top-level launch won. The committed entry is what the session-22 sweep's winner gives (the session-9
    winner's launch, from batch 16: `--min-batch 16`)."""
    monkeypatch.syspath_prepend(BENCH)
    import bf16_attn_bench as bab
    from radixflow.kernels import decode_attention as da

    committed = dict(da.DECODE_CONFIG["bf16"])
    assert bab.entry_for("n64w2s3", 16, 9) == committed
    assert bab.entry_for("default", 16, 9) == committed  # on the CPU the entry's device gates pass
    assert bab.entry_for("n64w4s3", 16, 9) is None
    monkeypatch.setitem(da.DECODE_CONFIG, "bf16", {})
    assert bab.entry_for("n64w2s3", 16, 9) == committed and bab.entry_for("default", 16, 9) is None
    assert bab.entry_for("n128w4s3", 512, 10) == {"block_n": 128, "min_batch": 512, "head_dim": 128,
                                                   "min_kv_heads": 8, "sm_major": 10}



def test_row_blocked_linear_equals_one_gemm(monkeypatch):
    """gemm_row_blocks' product: one GEMM per block of rows, a last block shorter or not, gives x @ w.T."""
    monkeypatch.syspath_prepend(BENCH)
    import torch
    from gpubench.row_blocks import row_blocked_linear

    g = torch.Generator().manual_seed(0)
    w = torch.randn(24, 16, generator=g, dtype=torch.float64)
    for rows in (10, 8, 3):
        x = torch.randn(rows, 16, generator=g, dtype=torch.float64)
        torch.testing.assert_close(row_blocked_linear(x, w, 4), x @ w.T, rtol=1e-12, atol=1e-12)


def test_mixed_projection_moves_rows_into_chunks_without_losing_any(monkeypatch):
    """offline_mixed_projection: with no fixed step cost, mixed passes move decode rows into the chunks without
    changing the total; with a fixed cost they save only the steps they remove (here: the early request's)."""
    monkeypatch.syspath_prepend(BENCH)
    import numpy as np
    from offline_mixed_projection import StepCost, project

    # two requests: 4 prompt tokens in chunk 0 with 3 outputs, 8 tokens ending in chunk 2 with 2 outputs
    reqs = [(4, 3), (8, 2)]
    steps = np.array([(b, kv, 1.0 + 2.0 * b) for b, kv in ((300, 1e3), (400, 5e3), (500, 2e3), (600, 9e3))])  # fixed 1, 2 a row
    cost = StepCost(steps, min_bs=300)
    assert abs(cost.fixed - 1.0) < 1e-9 and abs(cost.row - 2.0) < 1e-9 and abs(cost.kv) < 1e-9
    cost.step_ms = lambda batch, kv: cost.fixed + cost.row * batch  # small batches priced by the fit too
    first, mixed = project(reqs, cost, 0.0, 4, False), project(reqs, cost, 0.0, 4, True)
    assert first["decode_steps"] == 2 and mixed["decode_steps"] == 1  # request 0 decoded its 2 in chunks 1 and 2
    assert abs(first["total_s"] * 1e3 - (2 * 1.0 + 2.0 * 3)) < 1e-9  # steps of 2 and 1 rows
    assert abs(mixed["decode_rows_in_chunks_s"] * 1e3 - 2 * 2.0) < 1e-9
    assert abs(mixed["total_s"] * 1e3 - (2 * 2.0 + 1.0 + 2.0)) < 1e-9


def test_mixed_projection_prices_small_batches_at_their_measured_steps(monkeypatch):
    """Below min_bs a decode step costs the mean measured step of that batch, else the nearest batch's
    (not the fit's fixed + per-row price)."""
    monkeypatch.syspath_prepend(BENCH)
    import numpy as np
    from offline_mixed_projection import StepCost

    fit = [(b, kv, 1.0 + 2.0 * b) for b, kv in ((300, 1e3), (400, 5e3), (500, 2e3), (600, 9e3))]
    small = [(4, 100, 7.0), (4, 120, 9.0), (10, 300, 30.0)]
    cost = StepCost(np.array(fit + small), min_bs=300)
    assert abs(cost.step_ms(4, 0) - 8.0) < 1e-9  # the mean of batch 4's two steps
    assert abs(cost.step_ms(9, 0) - 30.0) < 1e-9  # no step of batch 9: batch 10's, the nearest
    assert abs(cost.step_ms(450, 0) - (1.0 + 2.0 * 450)) < 1e-9  # the fit from min_bs up


class _Event:
    """A CUDA event's stand-in: recorded at `ms`; elapsed_time to a later one in ms."""

    def __init__(self, ms: float):
        self.ms = ms

    def elapsed_time(self, other: "_Event") -> float:
        return other.ms - self.ms


def test_forward_recorder_runs_and_gaps_from_its_records(monkeypatch):
    """Passes extend 0-1 ms, extend 1.5-2, decode 5-6 (3 ms idle before it), decode 6.2-7, extend 9-10
    (2 ms before it): runs extend 2, decode 2, extend 1; gaps over 1 ms before passes 2 and 4."""
    monkeypatch.syspath_prepend(BENCH)
    from gpubench.offline import ForwardRecorder

    rec = ForwardRecorder.__new__(ForwardRecorder)  # no runner to wrap: the records alone
    spans = [("extend", 8, 0.0, 1.0), ("extend", 4, 1.5, 2.0), ("decode", 12, 5.0, 6.0), ("decode", 12, 6.2, 7.0),
             ("extend", 2, 9.0, 10.0)]  # fmt: skip
    rec.records = [(kind, bs, _Event(s), _Event(e), 0.0) for kind, bs, s, e in spans]
    assert rec.mode_runs() == [["extend", 2], ["decode", 2], ["extend", 1]]
    assert rec.gaps(1.0) == [(2, "decode", 12, 3.0), (4, "extend", 2, 2.0)]
    assert rec.gaps(5.0) == []


def test_mixed_projection_prices_gpubench_workload_and_refuses_bad_passes(tmp_path, monkeypatch):
    """The projection's requests are gpubench.offline's (lengths only); a --pass that names no seed, lacks
    its steps, or whose output tokens differ from the rebuilt workload's is refused with a message."""
    monkeypatch.syspath_prepend(BENCH)
    import pytest
    from gpubench import common
    from gpubench.offline import offline_requests
    from offline_mixed_projection import main, workload

    for key, value in common.SIZES.items():  # full sizes, whatever an earlier --smoke run left
        monkeypatch.setitem(common.SZ, key, value)
    monkeypatch.setattr(common.OPTS, "smoke", False, raising=False)
    reqs = workload(7)
    assert reqs == [(len(p), o) for p, o in offline_requests(7)] and len(reqs) == 1000
    steps = [(b, 1000 * b, 1.0 + 0.01 * b) for b in range(300, 1000, 50)] + [(5, 50, 2.0)]
    good = {"out_tokens": sum(o for _, o in reqs), "extend_gpu_s": 10.0, "decode_gpu_s": 12.0,
            "decode_steps_bs_kv_ms": steps}  # fmt: skip
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"a": {"seed7": good, "seed8": {"out_tokens": 1}, "seed9": {**good, "out_tokens": 5}}}))
    main([str(path), "--pass", "a/seed7"])
    for key, message in (("a/b", "its last key names the seed"), ("x/seed7", "no 'x' on the way"),
                         ("a/seed8", "has no decode_steps_bs_kv_ms, extend_gpu_s, decode_gpu_s"),
                         ("a/seed9", "the rebuilt workload has")):  # fmt: skip
        with pytest.raises(SystemExit, match=message):
            main([str(path), "--pass", key])


def test_gemm_row_blocks_times_a_one_block_control(monkeypatch, tmp_path):
    """gemm_row_blocks on the CPU at smoke sizes: every shape gets the blocks and the control (all rows as one
    block through row_blocked_linear), which is summed per layer but never chosen as best_block."""
    monkeypatch.syspath_prepend(BENCH)
    from gpubench import common, row_blocks

    monkeypatch.setitem(common.SZ, "rb_rows", 64)
    monkeypatch.setitem(common.SZ, "rb_blocks", (16, 32))
    monkeypatch.setattr(common.OPTS, "out", str(tmp_path), raising=False)  # log()'s bench.log
    out = row_blocks.sec_gemm_row_blocks()
    for name in row_blocks.SHAPES:
        assert out[name]["one_block_us"] > 0 and "one_block_max_diff" in out[name] and "rows16_us" in out[name]
    assert set(out["layer_us"]) == {"0", "16", "32", "one_block"} and out["best_block"] in (0, 16, 32)


def test_auto_first_batch_checks_its_sizes_and_shuts_the_replaced_backend_down(monkeypatch):
    """auto_first_batch_cpu.py: --rows / --runs below 1 are refused before any engine; each run's fresh
    backend replaces the scheduler's, whose compile pools (grammars and moves) are shut down."""
    import argparse
    from concurrent.futures import ThreadPoolExecutor

    import pytest

    monkeypatch.syspath_prepend(BENCH)
    import auto_first_batch_cpu as afb

    monkeypatch.setattr(afb, "make_engine", None)  # never reached
    for bad in (["--rows", "0"], ["--runs", "-1"]):
        with pytest.raises(SystemExit):
            afb.main(bad)

    class Backend:  # GrammarBackend's stand-in: its two pools
        def __init__(self, *args, **kw):
            self.cache = argparse.Namespace(pool=ThreadPoolExecutor(1))
            self.mover = argparse.Namespace(compiles=argparse.Namespace(pool=ThreadPoolExecutor(1)))
            self.jump_forward = self.switch_moved = lambda *a: 0

    monkeypatch.setattr(afb, "GrammarBackend", Backend)
    old = Backend()
    sched = argparse.Namespace(tokenizer=None, runner=argparse.Namespace(vocab_size=8), eos_ids=set(), args=None,
                               grammar_backend=old, jump_forward=None)  # fmt: skip
    eng = argparse.Namespace(scheduler=sched, builder=argparse.Namespace(grammar_backend="llguidance"))
    new, _ = afb.install(eng, switch=True)
    assert sched.grammar_backend is new and eng.builder.grammar_backend == "auto"
    for pool in (old.cache.pool, old.mover.compiles.pool):
        with pytest.raises(RuntimeError):  # shut down: takes no more work
            pool.submit(print)
    new.cache.pool.submit(print).result()  # the new one works
    afb.shut_down(new)


def test_decode_sweep_bounds_each_batch_by_the_bytes_it_reads(tmp_path, monkeypatch):
    """decode_sweep on the CPU at smoke sizes (tiny model): per batch the served step's time against its bound, the
    bytes a step reads being the weights once plus each row's KV, so the bound grows with the batch; no cuBLASLt rows."""
    from radixflow.model_files import resolve_model

    saved = _run(tmp_path, monkeypatch, lambda: {}, "--sections", "decode_sweep", "--sweep-batches", "1,3",
                 "--tokenizer", resolve_model(None).path)  # the default model's tokenizer; the tiny model's weights
    out = saved["decode_sweep"]
    assert "error" not in out, out.get("trace")
    assert out["lt_rows"] and all(v == [] for v in out["lt_rows"].values())  # cuBLASLt is timed on CUDA only
    from gpubench.common import SMOKE, TINY_CONFIG

    c = TINY_CONFIG
    kv_per_token = c["num_hidden_layers"] * c["num_key_value_heads"] * c["head_dim"] * 2 * 4  # K and V, float32
    one, three = out["bs1"], out["bs3"]
    assert three["read_bytes"] - one["read_bytes"] == int(2 * (SMOKE["prof_len"] + SMOKE["prof_out"] / 2) * kv_per_token)
    assert 0 < one["bound_ms"] <= three["bound_ms"]
    for r in (one, three):
        assert r["served_gpu_ms"] > 0 and r["served_of_bound"] == round(r["bound_ms"] / r["served_gpu_ms"], 3)
        assert r["served_out_tok_s"] > 0 and r["profiled_gpu_ms"] > 0
