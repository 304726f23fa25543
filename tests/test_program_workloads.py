"""Smoke of benchmarks/programs (the SGLang paper's workloads): a few of them, two programs
each and two tokens per gen, three ways on the shared Engine."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "programs"))
import run as program_bench  # noqa: E402


def test_optimal_hit_rate_counts_shared_prefixes_and_earlier_outputs():
    calls = [([1, 2, 3, 4], [9]), ([1, 2, 3, 5], []), ([1, 2, 3, 4, 9, 7], []), ([8], [])]
    # reusable: 0, then [1 2 3], then [1 2 3 4 9] (an output), then nothing (one token must be computed)
    assert program_bench.optimal_hit_rate(calls) == (0 + 3 + 5 + 0) / (4 + 4 + 6 + 1)


def test_workloads_run_three_ways(engine):
    sampling = {"max_new_tokens": 2, "temperature": 0}
    results = program_bench.run_all(engine, ["generative_agents", "dspy_rag"], n=2, size=0.05, sampling=sampling)
    assert results["generative_agents"]["graph"]["mode"] == "graph"
    assert results["dspy_rag"]["graph"]["mode"] == "graph"
    for r in results.values():
        assert r["eager-noradix"]["hit"] == 0.0
        assert 0.0 < r["optimal_hit"] <= 1.0
        assert r["eager"]["hit"] <= r["optimal_hit"] + 1e-9
        assert all(r[m]["throughput"] > 0 for m in program_bench.MODES)
    assert "Geometric mean" in program_bench.table(results)
    assert not engine.scheduler.tree.disable  # the radix cache is back on
