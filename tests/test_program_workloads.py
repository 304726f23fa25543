"""Smoke of benchmarks/programs (the SGLang paper's workloads): a few of them, two programs
each and two tokens per gen, three ways on the shared Engine."""

from __future__ import annotations

import gc
import json
import os
import random
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "programs"))
import bound_floor  # noqa: E402
import engine_sampler  # noqa: E402
import extend_shapes  # noqa: E402
import host_profile  # noqa: E402
import idle_gaps  # noqa: E402
import mixed_pass_probe  # noqa: E402
import pass_shapes  # noqa: E402
import pass_timer  # noqa: E402
import run as program_bench  # noqa: E402
import workloads as program_workloads  # noqa: E402
from radixflow.runtime import gc_freeze  # noqa: E402


def test_idle_gaps_charges_each_idle_moment_to_the_innermost_open_interval():
    # a 10 ms round; kernels 1-3 and 5-9 ms; a launch 2.5-4.5 ms inside a step 0-9.5 ms inside a turn 0-10 ms
    r = idle_gaps.attribute([(1000, 3000), (5000, 9000)], [("launch", 0.0025, 0.0045), ("step", 0.0, 0.0095),
                            ("turn", 0.0, 0.01)], h0=0.0, g0=0.0, h1=0.01, g1=10000)  # fmt: skip
    ms = {k: round(1000 * v, 2) for k, v in r.items() if k.endswith("_s")}
    assert (ms["busy_s"], ms["lead_s"], ms["tail_s"]) == (6.0, 1.0, 1.01)  # the tail holds the grid's last cell
    assert (ms["launch_s"], ms["step_s"], ms["turn_s"], ms["outside turns_s"]) == (1.5, 0.5, 0.0, 0.0)  # 3-5 ms idle
    stacks = idle_gaps.idle_stacks([(0.0005, "a"), (0.002, "b"), (0.004, "c"), (0.0042, "c")], [(1000, 3000)], 0.0, 0.0)
    assert stacks == [("c", 2 / 3), ("a", 1 / 3)]  # "b" was taken while a kernel ran


def test_optimal_hit_rate_counts_shared_prefixes_and_earlier_outputs():
    calls = [([1, 2, 3, 4], [9]), ([1, 2, 3, 5], []), ([1, 2, 3, 4, 9, 7], []), ([8], [])]
    # reusable: 0, then [1 2 3], then [1 2 3 4 9] (an output), then nothing (one token must be computed)
    assert program_bench.optimal_hit_rate(calls) == (0 + 3 + 5 + 0) / (4 + 4 + 6 + 1)


def test_host_profile_charges_c_functions_to_their_callers_module():
    """by_area: the areas sum to the profile's total, and time in a C function (sorted) lands in
    the module that called it, not in an area of its own."""
    import cProfile
    import pstats
    import time as time_module

    from radixflow.runtime.scheduling import req as req_module

    def work() -> None:
        sorted(range(300_000), key=str)  # C calling C: all of it charged to this module
        req_module.Req("r", [1, 2, 3], None).token_range(0, 2)

    prof = cProfile.Profile(time_module.thread_time)
    prof.enable()
    work()
    prof.disable()
    areas = {a: t for t, a in host_profile.by_area(pstats.Stats(prof))}
    assert abs(sum(areas.values()) - pstats.Stats(prof).total_tt) < 1e-6
    assert "~" not in areas and "radixflow/runtime/scheduling/req.py" in areas
    assert max(areas, key=areas.get) == "test_program_workloads.py"
    assert areas["test_program_workloads.py"] > 0.9 * pstats.Stats(prof).total_tt


def test_programs_per_s_is_programs_over_total_time():
    """Two rounds of 64 programs at 128 and 64 programs/s: 128 programs in 1.5 s, not the mean 96."""
    rounds = [{"throughput": 128.0}, {"throughput": 64.0}]
    assert abs(program_bench.programs_per_s(rounds) - 128 / 1.5) < 1e-9


def test_workloads_run_three_ways(engine, monkeypatch):
    gc.unfreeze()  # whatever earlier tests froze: this engine's freeze then thaws at its release below
    monkeypatch.setattr(gc_freeze, "_state", gc_freeze.FreezeState())
    monkeypatch.setattr(engine, "_gc", gc_freeze.EngineFreeze())  # the only live engine: its freeze_gc() freezes
    try:
        _check_workloads_run_three_ways(engine)
    finally:
        engine._gc.release()


def _check_workloads_run_three_ways(engine) -> None:
    sampling = {"max_new_tokens": 2, "temperature": 0}
    results = program_bench.run_all(engine, ["generative_agents", "dspy_rag"], n=2, size=0.05, sampling=sampling)
    assert results["generative_agents"]["graph"]["mode"] == "graph"
    assert results["dspy_rag"]["graph"]["mode"] == "graph"
    for r in results.values():
        assert r["eager-noradix"]["hit"] == 0.0
        assert 0.0 < r["optimal_hit"] <= 1.0
        assert r["eager"]["hit"] <= r["optimal_hit"] + 1e-9
        assert all(r[m]["throughput"] > 0 for m in program_bench.MODES)
        for run in (x for m in program_bench.MODES for x in r[m]["runs"]):  # the round = model + host time
            assert run["model_s"] > 0
            round_s = r["programs_per_round"] / run["throughput"]
            assert abs(run["model_s"] + run["host_ms_per_pass"] * run["scheduler_steps"] / 1000 - round_s) < 1e-6
    assert "Geometric mean" in program_bench.table(results)
    assert program_bench.bound_table(results) == program_bench.BOUND_NOTE  # no GPU time on the CPU
    for r in results.values():
        assert r["frozen_after_warm_up"] > 0
        assert all(r[m]["extend_tokens"] > 0 and r[m]["total_s"] > 0 for m in program_bench.MODES)
    assert not engine.scheduler.tree.disable  # the radix cache is back on


def test_short_rounds_are_lengthened_with_the_same_programs_in_flight(engine, monkeypatch):
    assert program_bench.round_waves(0.0, 300.0, 64) == 1
    assert program_bench.round_waves(1.0, 300.0, 64) == 5  # 64 programs last 0.21 s: 5 x 64 last 1.07 s
    assert program_bench.round_waves(1.0, 30.0, 64) == 1 and program_bench.round_waves(100.0, 300.0, 64) == 8
    workload = program_bench.BY_NAME["dspy_rag"]
    in_flight, peak = [0], [0]

    class Counting:  # the program, counting how many of its runs are under way at once
        async def run_async(self, **kw):
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
            try:
                return await workload.program.run_async(**kw)
            finally:
                in_flight[0] -= 1

    counted = program_workloads.Workload("dspy_rag", Counting(), workload.inputs)
    waves = program_bench.round_waves
    monkeypatch.setattr(program_bench, "round_waves", lambda s, p, n: waves(s, p, n, most=2))  # k = 2: a short test
    sampling = {"max_new_tokens": 2, "temperature": 0}
    r = program_bench.run_workload(engine, counted, 2, 0.05, sampling, seed=0, min_round_s=1000.0)
    assert r["programs_per_round"] == 4 and r["in_flight"] == 2 and peak[0] == 2
    assert r["graph"]["mode"] == "graph" and all(len(r[m]["runs"]) == 1 for m in program_bench.MODES)
    # a later engine (--later-modes graph): the first one's rounds, its own graph mode, the rest borrowed
    later = program_bench.run_workload(engine, counted, 2, 0.05, sampling, seed=0, modes=("graph",), waves=r["waves"])
    assert later["programs_per_round"] == 4 and set(program_bench.MODES) - set(later) == {"eager", "eager-noradix"}
    program_bench.borrow_modes(later, r)
    assert later["borrowed"] == ["eager", "eager-noradix"] and later["eager-noradix"] is r["eager-noradix"]
    assert later["optimal_hit"] == r["optimal_hit"] and "eager, eager-noradix: the first engine's" in program_bench.table({"w": later})


def _mode(total_s: float, gpu_s, rounds: int = 2) -> dict:
    return {"total_s": total_s, "total_gpu_s": gpu_s, "runs": [{}] * rounds, "extend_tokens": 100, "decode_tokens": 8}


def test_the_bound_table_compares_gpu_busy_time_with_host_time_taken_out():
    """graph: 1.0 s of wall, 0.5 s GPU busy; no radix: 4.0 s wall, 1.5 s GPU busy (two rounds):
    measured 4x, graph's host-only time zero 8x, both zero 3x; and on the CPU no bound at all."""
    results = {"w": {"graph": _mode(1.0, 0.5), "eager": _mode(1.2, 0.6), "eager-noradix": _mode(4.0, 1.5)}}
    out = program_bench.bound_table(results)
    assert "| w | 0.500 / 0.600 / 2.000 | 0.250 / 0.300 / 0.750 | 0.250 / 0.300 / 1.250 |" in out
    assert "| 4.00x | 8.00x | 3.00x |" in out
    assert "measured **4.00x**; graph mode's host-only time zero **8.00x**; both columns' host-only time zero **3.00x**" in out
    cpu = {"w": {m: _mode(1.0, None) for m in program_bench.MODES}}
    assert program_bench.bound_table(cpu) == program_bench.BOUND_NOTE
    # --baseline-repeats 1: no radix's one round against graph's two, compared a round against a round
    one = {"w": {"graph": _mode(1.0, 0.5), "eager": _mode(1.2, 0.6), "eager-noradix": _mode(2.0, 0.75, rounds=1)}}
    assert "| 4.00x | 8.00x | 3.00x |" in program_bench.bound_table(one)
    x, g = one["w"]["eager-noradix"], one["w"]["graph"]
    for m in (x, g):
        m["runs"] = [{"round_s": m["total_s"] / len(m["runs"]), "gc_ms": 0.0, "forward_steps": 1, "extend_tokens": 1,
                      "decode_tokens": 0}] * len(m["runs"])
    assert bound_floor.ratios(bound_floor.Chip(1.0, 1.0, 1.0, 1.0), one["w"])["measured"] == 4.0
    # a later engine's row: its eager and no-radix columns are the first engine's, and say so
    results["w"]["borrowed"] = ["eager", "eager-noradix"]
    assert "| w (eager, eager-noradix: the first engine's) | 0.500 / 0.600 / 2.000 |" in program_bench.bound_table(results)


def test_the_roofline_floor_takes_the_weight_read_or_the_flops_whichever_is_longer():
    """1 GB of weights at 1 GB/s, 1 GFLOP a token at 10 GFLOP/s: 4 passes of 20 tokens are 4 s
    (weights), 2 passes of 100 tokens 10 s (FLOPs); graph 8 s wall over 2 rounds, 6 s GPU busy."""
    chip = bound_floor.Chip(weight_bytes=1e9, bytes_per_s=1e9, flops_per_token=1e9, flops_per_s=1e10)
    run = lambda steps, tokens, s, gpu, gc: {"forward_steps": steps, "extend_tokens": tokens, "decode_tokens": 0,
                                            "round_s": s, "gpu_s": gpu, "gc_ms": gc}  # fmt: skip
    graph = {"runs": [run(4, 20, 4.0, 3.0, 1000.0), run(4, 20, 4.0, 3.0, 0.0)], "total_s": 8.0, "total_gpu_s": 6.0}
    noradix = {"runs": [run(2, 100, 20.0, 18.0, 0.0)] * 2, "total_s": 40.0, "total_gpu_s": 36.0}
    r = bound_floor.ratios(chip, {"graph": graph, "eager-noradix": noradix})
    assert r == {"measured": 5.0, "no_gc": 40.0 / 7.0, "graph_host_zero": 40.0 / 6.0, "both_host_zero": 6.0,
                 "floor": 20.0 / 8.0}  # fmt: skip


def test_a_pass_floor_counts_the_kv_it_reads_and_the_attention_it_computes():
    """Weights 1 byte, KV 1 byte a token, 1 byte/s; 1 FLOP a token, attention 1 FLOP a pair, 1 FLOP/s."""
    model = pass_shapes.Model(weight_bytes=1, linear_flops_per_token=1, kv_bytes_per_token=1, attn_flops_per_pair=1)
    chip = pass_shapes.Chip(bytes_per_s=1, flops_per_s=1)
    # decode, contexts 9 and 99 before the new token: reads 1 + 10 + 100; computes 2 + 110 pairs
    assert pass_shapes.pass_floor(model, chip, True, [9, 99], [1, 1]) == 112
    # extend 3 tokens after a 10-token prefix: reads 1 + 10; computes 3 + (3 x 10 + 6) pairs
    assert pass_shapes.pass_floor(model, chip, False, [10], [3]) == 39


def _gpu_workload(graph_passes: float, noradix_passes: float, graph_gpu_s, noradix_gpu_s) -> dict:
    mode = lambda passes, gpu_s: {"runs": [{}], "total_gpu_s": gpu_s, "forward_steps": passes,  # noqa: E731
                                  "decode_tokens": 0}
    return {"graph": mode(graph_passes, graph_gpu_s), "eager-noradix": mode(noradix_passes, noradix_gpu_s)}


def test_the_floor_report_leaves_out_replays_that_ran_other_passes():
    """A replay whose pass count is off by more than 10% prices other passes: not in the geomean."""
    gpu = {"a": _gpu_workload(10, 20, 1.0, 4.0), "b": _gpu_workload(30, 20, 1.0, 9.0)}
    floors = {"a": {"graph": {"passes": 11, "floor_s": 0.5, "decode_rows": 0},
                    "eager-noradix": {"passes": 18, "floor_s": 3.0, "decode_rows": 0}},
              "b": {"graph": {"passes": 10, "floor_s": 0.1, "decode_rows": 0},  # 10 passes against 30
                    "eager-noradix": {"passes": 20, "floor_s": 8.0, "decode_rows": 0}}}  # fmt: skip
    out = pass_shapes.report(gpu, floors)
    assert "over the 1 workloads" in out and "**4.00x**" in out and "**6.00x**" in out  # a's 4 / 1 and 3 / 0.5
    assert "Left out (replay ran other passes): b." in out


def test_the_floor_report_refuses_a_cpu_run_clearly():
    with pytest.raises(SystemExit, match="no GPU busy time for a"):
        pass_shapes.check_gpu_json("cpu.json", {"a": _gpu_workload(1, 1, None, None)})


def test_kernel_time_is_absent_without_cuda(engine):
    workload = program_bench.BY_NAME["dspy_rag"]
    inputs = workload.inputs(random.Random(0), 2, 0.05)
    sampling = {"max_new_tokens": 2, "temperature": 0}
    assert program_bench.kernel_round_s(engine, workload, inputs, "graph", sampling, in_flight=2) is None


def test_kernel_busy_time_counts_overlapping_kernels_once():
    """Kernels at 0-10, 5-12 and 20-25 us (a copy overlapping a kernel): 17 us busy, not 22."""
    assert abs(pass_timer.busy_union_s([(20, 25), (0, 10), (5, 12)]) - 17e-6) < 1e-15
    assert pass_timer.busy_union_s([]) == 0.0


def test_the_bound_table_adds_kernel_time_when_it_was_traced():
    results = {"w": {"graph": _mode(1.0, 0.5), "eager": _mode(1.2, 0.6), "eager-noradix": _mode(4.0, 1.5)}}
    assert "kernel" not in program_bench.bound_table(results)
    for m, k in (("graph", 0.2), ("eager", 0.25), ("eager-noradix", 0.7)):
        results["w"][m]["kernel_s"] = k
    out = program_bench.bound_table(results)
    assert "| w | 0.200 / 0.250 / 0.700 | 0.80 / 0.93 | 3.50x |" in out and "kernel time: **3.50x**" in out


def test_extend_graph_settings_and_their_table():
    """--extend-graph-tokens 0,256: one engine per value; the table sets each against the first."""
    assert program_bench.extend_graph_settings("0,256") == [0, 256]
    assert program_bench.extend_graph_settings("default,0") == ["default", 0]
    for bad in ("0,x", "-1", "64,64"):
        with pytest.raises(SystemExit):
            program_bench.extend_graph_settings(bad)
    two = [{}, {}]  # two rounds: GPU busy seconds a round, half the total
    off = {"w": {"graph": {"throughput": 2.0, "total_gpu_s": 2.0, "runs": two}, "eager-noradix": {"throughput": 1.0}}}
    on = {"w": {"graph": {"throughput": 3.0, "total_gpu_s": 1.0, "runs": two}, "eager-noradix": {"throughput": 1.5}}}
    out = program_bench.extend_graph_table({0: off, 256: on})
    assert "| w | 2.00 (1.00x); 2.00x; 1.000 s | 3.00 (1.50x); 2.00x; 0.500 s |" in out and "Rows over 1 workloads." in out
    on["w"]["borrowed"] = ["eager", "eager-noradix"]  # --later-modes graph: the first engine's no-radix baseline
    assert "3.00 (1.50x); 2.00x (first's no radix); 0.500 s |" in program_bench.extend_graph_table({0: off, 256: on})


@pytest.mark.parametrize("args, message", [
    (["--repeats", "2", "--baseline-repeats", "3"], "--baseline-repeats 3: from 1 to --repeats"),
    (["--repeats", "2", "--baseline-repeats", "0"], "--baseline-repeats 0: from 1 to --repeats"),
    (["--later-modes", "graph,bogus"], "--later-modes 'graph,bogus'"),
    (["--later-modes", "eager"], "--later-modes 'eager': 'graph'"),  # its graph figures would be the first engine's
])  # fmt: skip
def test_main_refuses_bad_round_and_mode_options_before_any_engine(monkeypatch, args, message):
    monkeypatch.setattr(program_bench.rf, "Engine", None)  # never reached
    with pytest.raises(SystemExit, match=message.replace("(", r"\(")):
        program_bench.main(["--extend-graph-tokens", "default,0", *args])


def test_fewer_no_radix_rounds_run_after_the_paired_ones(engine, monkeypatch):
    """--repeats 2 --baseline-repeats 1: graph, eager | eager, graph, then the one no-radix round, so
    neither compared mode follows a no-radix run; the warm-ups end on a graph or eager run too."""
    assert program_bench.round_plan(2, 1) == ["graph", "eager", "eager", "graph", "eager-noradix"]
    assert program_bench.round_plan(2) == program_bench.round_plan(2, 2) == [
        "eager-noradix", "graph", "eager", "eager-noradix", "eager", "graph"]  # fmt: skip
    assert program_bench.round_plan(2, 1, ("graph",)) == ["graph", "graph"]
    order, run_mode = [], program_bench.run_mode
    monkeypatch.setattr(program_bench, "run_mode", lambda *a, **kw: order.append(a[3]) or run_mode(*a, **kw))
    sampling = {"max_new_tokens": 2, "temperature": 0}
    r = program_bench.run_workload(engine, program_bench.BY_NAME["dspy_rag"], 2, 0.05, sampling, seed=0, repeats=2,
                                   baseline_repeats=1, freeze_gc=False)  # fmt: skip
    warm_ups = ["eager-noradix", "graph", "eager"] * 2  # each twice, also with one wave a round
    assert order == warm_ups + program_bench.round_plan(2, 1)  # warm-ups, then the rounds
    assert [len(r[m]["runs"]) for m in program_bench.MODES] == [2, 2, 1] and len(r["graph_vs_eager"]) == 2


def test_a_round_that_compiled_a_kernel_runs_again(engine, monkeypatch):
    """A round during which Triton compiled a variant (its compile ran inside a forward pass) is not a
    steady-state round: it runs again once, and only the second run counts; the first is kept apart."""
    calls, run_mode = [], program_bench.run_mode

    def compiles_once(*a, **kw):
        r = run_mode(*a, **kw)
        calls.append(a[3])
        if len(calls) == 8:  # the first timed graph round (six warm-ups, then no radix, graph, eager)
            r["jit_compiles"] = {"extend_attention._extend_kernel": 1}
        return r

    monkeypatch.setattr(program_bench, "run_mode", compiles_once)
    sampling = {"max_new_tokens": 2, "temperature": 0}
    r = program_bench.run_workload(engine, program_bench.BY_NAME["mmlu"], 2, 0.05, sampling, seed=0, freeze_gc=False)
    assert calls[6:] == ["eager-noradix", "graph", "graph", "eager"]
    assert [c["round"] for c in r["compiling_rounds"]] == ["graph"]
    assert r["compiling_rounds"][0]["jit_compiles"] and not r["graph"]["runs"][0]["jit_compiles"]
    assert [len(r[m]["runs"]) for m in program_bench.MODES] == [1, 1, 1]


def test_extend_shapes_counts_the_passes_each_setting_would_take():
    # (new tokens, requests, logits rows): the last pass's 70 logits rows (input logprobs) fit no bucket of 64
    shapes = {"w": [(20, 2, 2), (300, 8, 8), (100, 80, 80), (30, 4, 70)], "none": []}
    out = extend_shapes.report(shapes, extend_shapes.parse_limits("256/64,512/128"))
    assert "| w | 4 | 65 / 300 | 6 / 80 | 1 | 4 |" in out
    assert "| none | 0 | 0 / 0 | 0 / 0 | 0 | 0 |" in out
    with pytest.raises(SystemExit):
        extend_shapes.parse_limits("256")


def test_host_drift_compare_lists_the_functions_whose_calls_differ(tmp_path):
    """host_drift.py --compare: call counts matched across processes by name (object addresses dropped),
    and only the functions whose counts differ are listed."""
    import json

    import host_drift

    def run(protocol: str, calls: dict) -> str:
        path = tmp_path / f"{protocol}.json"
        rounds = {"cpu_ms_per_program": [1.0], "host_ms_per_pass": [2.0], "round_s": [0.5], "profiled_steps": 3}
        path.write_text(json.dumps({"protocol": protocol, "results": {"llm_judge": {**rounds, "calls": calls}}}))
        return str(path)

    a = run("all", {"~:0(<function f at 0x7f01>)": [5, 0.1], "radix_tree.py:194(evict)": [9, 0.2]})
    b = run("graph", {"~:0(<function f at 0x7fab>)": [5, 0.1], "radix_tree.py:194(evict)": [2, 0.1]})
    out = host_drift.compare(a, b)
    assert "calls in the profiled graph round: 14 / 7" in out
    assert "+7  radix_tree.py:194(evict)  (9 / 2)" in out
    assert "function f" not in out  # same function, same count, in both processes

class _Clock:
    """time.time / time.perf_counter for run.py, advanced by hand."""

    def __init__(self):
        self.now = 0.0

    def time(self) -> float:
        return self.now

    perf_counter = time


def _fake_workload(clock: _Clock, seen: list, seconds: float):
    """run_workload's stand-in: takes `seconds` of the fake clock and records (engine, workload, modes, waves)."""

    def run_workload(engine, workload, n, size, sampling, seed, repeats, min_round_s, freeze_gc, kernel_time,
                     modes, waves, baseline_repeats):  # fmt: skip
        clock.now += seconds
        seen.append((engine.setting, workload.name, modes, waves))
        mode = {"mode": "graph", "throughput": 2.0, "p50": 0.1, "hit": 0.5, "total_gpu_s": None, "runs": [{}]}
        return {"programs_per_round": 2 * (3 if waves is None else waves), "in_flight": 2,
                "waves": 3 if waves is None else waves, "optimal_hit": 0.5, **{m: dict(mode) for m in modes}}

    return run_workload


def test_later_engines_run_the_first_engines_workloads_and_rounds(monkeypatch, tmp_path):
    """--extend-graph-tokens default,0 --deadline-s 240, all modes in both engines: each engine takes
    100 s to start and 50 s a workload. The first gets 120 s from when it is up (3 of 5 workloads start by
    then); the second runs those 3 with the first's waves, though its own share would be over; the 2
    skipped are in the JSON and under the tables."""
    clock, seen = _Clock(), []

    class Engine:
        def __init__(self, config, **kw):
            clock.now += 100.0
            self.setting = kw.get("cuda_graph_extend_max_tokens", "default")
            self.runner = type("Runner", (), {"extend_graphs": None})()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(program_bench, "time", clock)
    monkeypatch.setattr(program_bench.rf, "Engine", Engine)
    monkeypatch.setattr(program_bench, "run_workload", _fake_workload(clock, seen, 50.0))
    monkeypatch.setattr(program_bench, "frozen_garbage", lambda: {"frozen": 0, "freed_after_unfreezing": 0})
    monkeypatch.setattr(program_bench, "tracked_objects", lambda: {"tracked": 0})
    names = ["llm_judge", "json_decode", "react", "dspy_rag", "hellaswag"]
    out_json = tmp_path / "r.json"
    out = program_bench.main(["--workloads", ",".join(names), "--extend-graph-tokens", "default,0", "--deadline-s",
                              "240", "--json", str(out_json)])  # fmt: skip
    first = [(w, m, v) for s, w, m, v in seen if s == "default"]
    later = [(w, m, v) for s, w, m, v in seen if s == 0]
    assert [w for w, _, _ in first] == names[:3] and all(v is None for _, _, v in first)
    assert later == [(w, program_bench.MODES, 3) for w in names[:3]]  # the first's workloads and waves, all modes
    assert "over 3 of 5 workloads (skipped past the deadline: dspy_rag, hellaswag)" in out
    assert "Rows over 3 of 5 workloads" in out
    saved = json.loads(out_json.read_text())
    assert saved["skipped_workloads"] == {"default": ["dspy_rag", "hellaswag"], "0": ["dspy_rag", "hellaswag"]}
    assert not any(r.get("borrowed") for r in saved["by_extend_graph_tokens"]["0"].values())
    seen.clear()  # --later-modes graph: the later engine runs graph alone, on the same workloads, the rest marked
    out = program_bench.main(["--workloads", ",".join(names), "--extend-graph-tokens", "default,0", "--deadline-s",
                              "180", "--later-modes", "graph"])  # fmt: skip
    assert [(w, m) for s, w, m, _ in seen if s == 0] == [(w, ("graph",)) for w in names[:4]]  # all 180 s: 4 started
    assert "(first's no radix)" in out and "over 4 of 5 workloads (skipped past the deadline: hellaswag)" in out


def test_mixed_pass_probe_prices_the_extend_passes_run_while_requests_decode():
    passes = [("extend", 0, 0.010, 4), ("decode", 0, 0.004, 2), ("extend", 3, 0.012, 1), ("decode", 0, 0.006, 4),
              ("segment", 0, 0.008, 3)]  # fmt: skip
    r = mixed_pass_probe.summary(passes)
    assert (r["extend_passes"], r["decode_passes"], r["segment_passes"], r["extends_while_decoding"]) == (2, 2, 1, 1)
    assert r["mean_decode_ms"] == pytest.approx(5.0) and r["mean_decode_rows"] == 3 and r["mean_decoding_rows"] == 3
    assert r["saving_at_most"] == pytest.approx(0.005 / 0.040)


def test_mixed_pass_probe_logs_every_forward_pass_of_a_round(engine):
    w = program_workloads.BY_NAME["generative_agents"]
    inputs = w.inputs(random.Random(0), 2, 0.05)
    sampling = {"max_new_tokens": 2, "temperature": 0}
    before = engine.scheduler.stats.forward_steps
    log = mixed_pass_probe.PassLog(engine, kv=True)
    try:
        program_bench.run_mode(engine, w, inputs, "graph", sampling)
    finally:
        passes = log.close()
    decodes = [p for p in passes if p[0] == "decode"]
    assert decodes and len(log.kv_reads) == len(decodes)  # --kv: one count a decode pass
    assert all(0 < distinct <= read for read, distinct in log.kv_reads)
    assert engine.scheduler._run_extend.__func__ is type(engine.scheduler)._run_extend  # unwrapped again
    assert len(passes) == engine.scheduler.stats.forward_steps - before
    assert {p[0] for p in passes} <= {"extend", "decode", "segment"} and "extend" in {p[0] for p in passes}
    assert all(t > 0 and rows > 0 for _, _, t, rows in passes)


def test_engine_sampler_counts_the_engine_loops_stack_by_part_and_function(engine):
    w = program_workloads.BY_NAME["generative_agents"]
    inputs = w.inputs(random.Random(0), 2, 0.05)
    sampling = {"max_new_tokens": 2, "temperature": 0}
    switch = sys.getswitchinterval()
    with engine_sampler.LoopSampler(0.0005) as s:
        for _ in range(20):  # a few rounds: the sampler only counts moments the engine loop is running
            program_bench.run_mode(engine, w, inputs, "graph", sampling)
            if s.samples >= 5:
                break
    assert sys.getswitchinterval() == switch  # restored
    assert s.samples >= 5 and s.inclusive["radixflow/runtime/engine_stepper.py:_loop"] == s.samples
    assert sum(s.own.values()) == s.samples and 0 < sum(s.parts.values()) <= s.samples
    assert all(k.split(" > ")[0] in ("step", "_turn") for k in s.parts)
    assert "%" in s.table(s.parts, 3)
