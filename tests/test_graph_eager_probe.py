"""benchmarks/programs/graph_eager_probe.py (issue 29): what it records around an engine, smoked on the CPU."""

from __future__ import annotations

import os
import sys
import traceback
from types import SimpleNamespace

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "programs"))
import graph_eager_probe  # noqa: E402
import probe_logs  # noqa: E402
from radixflow.runtime.execution.forward_batch import ForwardMode  # noqa: E402

TINY = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "configs", "smollm2-tiny.json")


def _pass(mode, ext):
    return SimpleNamespace(mode=mode, extend_lens_list=ext, batch_size=len(ext))


def test_pass_kinds_tell_decode_rows_riding_in_an_extend_pass_apart():
    assert probe_logs.pass_kind(_pass(ForwardMode.DECODE, [1, 1]), False) == "decode"
    assert probe_logs.pass_kind(_pass(ForwardMode.EXTEND, [8, 8]), True) == "extend_graph"
    assert probe_logs.pass_kind(_pass(ForwardMode.EXTEND, [1]), False) == "extend_eager"  # one request, one token
    assert probe_logs.pass_kind(_pass(ForwardMode.EXTEND, [8, 1, 1]), True) == "mixed_graph"
    assert probe_logs.ones(_pass(ForwardMode.EXTEND, [8, 1, 1])) == 2
    assert probe_logs.ones(_pass(ForwardMode.DECODE, [1, 1])) == 0


def test_a_sync_is_charged_to_the_innermost_radixflow_line():
    frame = lambda path, line, name: traceback.FrameSummary(path, line, name)  # noqa: E731
    stack = [frame("/x/run.py", 1, "main"), frame("/w/radixflow/runtime/scheduling/scheduler.py", 266, "_advance_host"),
             frame("/v/torch/_tensor.py", 9, "tolist"), frame("/w/benchmarks/programs/probe_logs.py", 5, "_show")]
    assert probe_logs.radixflow_site(stack) == "radixflow/runtime/scheduling/scheduler.py:266 _advance_host"
    assert probe_logs.radixflow_site(stack[:1]) == "run.py:1 main"


def test_the_probe_runs_both_modes_through_padded_passes_on_the_cpu(monkeypatch):
    import radixflow as rf

    monkeypatch.setattr(rf.Engine, "freeze_gc", lambda self: 0)  # the process's GC state is other tests' too
    out = graph_eager_probe.main(["--smoke", "--settings", "48", "--workloads", "mmlu,generative_agents",
                                  "--config", TINY, "--load-format", "dummy", "--device", "cpu"])  # fmt: skip
    (engine,) = out["engines"]
    assert engine["setting"] == "48" and engine["extend_graphs"]["graphs"] is False and engine["extend_graphs"]["buckets"] > 0
    for name in ("mmlu", "generative_agents"):
        r = engine["workloads"][name]
        for mode in graph_eager_probe.MODES:
            m = r[mode]
            assert m["programs_per_s"] > 0 and m["passes"] >= 1
            # a split decode step (continuing rows' extend, then the others' decode) is one step and two passes
            split = m["scheduler_per_round"].get("split_decode_steps", 0)
            assert sum(k["passes"] for k in m["by_kind_per_round"].values()) == m["passes"] + split
            assert m["scheduler_per_round"]["forward_steps"] == m["passes"]
            assert r["syncs"][mode]["syncs"] == {}  # nothing counts them on the CPU
    kinds = engine["workloads"]["generative_agents"]["graph"]["by_kind_per_round"]
    assert "decode" in kinds and any(k.endswith("_graph") for k in kinds)  # its small extends took a bucket
    assert engine["first_replays"] == []  # no graphs on the CPU
    rows = engine["mixed_costs"]
    assert [r["continuing"] for r in rows] == list(graph_eager_probe.MIXED_SMOKE["continuing"])
    assert all(r["mixed_ms"] > 0 and r["split_ms"] > 0 and r["decode_all_ms"] > 0 for r in rows)
    assert rows[0]["bucket"] is not None  # the mixed pass fits a bucket: the runner's path is the padded one
