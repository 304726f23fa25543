"""Tensor parallelism on CPU (gloo), beyond test_tp_cpu.py: the leader protocol still works, and a
rank whose replicated scheduler diverges is detected. (One process holds one tensor-parallel group
at a time, so these start after test_tp_cpu.py's module engine is gone.)"""

from __future__ import annotations

import time

import pytest

from test_tp_cpu import CONSTRAINED, GREEDY, PROMPTS

SMALL_KV = 4096  # KV slots per rank: these engines run a few short requests (the suite's memory stays low)


@pytest.fixture(scope="module")
def reference(engine) -> dict:
    return {"batch": [o["text"] for o in engine.generate(PROMPTS, GREEDY)], "constrained": engine.generate(*CONSTRAINED)["text"]}


def test_tp2_leader_scheduler_matches_tp1(reference):
    """The previous protocol (rank 0 schedules alone and broadcasts each pass) stays selectable."""
    from radixflow import Engine

    with Engine(tp_size=2, tp_scheduler="leader", max_total_tokens=SMALL_KV) as e:
        assert e.scheduler.replica is None
        assert [o["text"] for o in e.generate(PROMPTS, GREEDY)] == reference["batch"]
        assert e.generate(*CONSTRAINED)["text"] == reference["constrained"]


def test_a_diverging_rank_is_detected(monkeypatch):
    """Rank 1 drops a request rank 0 runs (a test hook): it finds a pass where it expected the next
    step, stops, and the Engine fails with that reason instead of hanging in a collective."""
    from radixflow import Engine
    from radixflow.runtime.distributed.tp_launch import TPRankFailed
    from radixflow.env import TP_DIVERGE_RID_PREFIX

    monkeypatch.setenv(TP_DIVERGE_RID_PREFIX, "diverge-")  # read by the spawned rank 1
    e = Engine(tp_size=2, max_total_tokens=SMALL_KV)
    try:
        assert e.generate(PROMPTS[0], GREEDY, rid="agree-1")["text"]
        start = time.time()
        with pytest.raises(TPRankFailed, match="rank 1 failed: TPDivergedError: .*diverged from rank 0"):
            e.generate(PROMPTS[0], GREEDY, rid="diverge-1")
        assert time.time() - start < 10
    finally:
        e.shutdown()
