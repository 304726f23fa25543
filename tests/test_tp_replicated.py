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


class _Wire:
    """Rank 0's step channel to one other rank, in one process: what one publishes the other receives."""

    def __init__(self):
        self.sent: list = []

    def end(self, leader: bool):
        from types import SimpleNamespace

        from radixflow.runtime.distributed.step_channel import Message

        wire = self
        return SimpleNamespace(
            tp=SimpleNamespace(is_leader=leader, rank=0 if leader else 1),
            publish=lambda kind, digest, payload=b"": wire.sent.append(Message(kind, digest, payload)),
            receive=lambda: wire.sent.pop(0),
        )


def _replicas():
    from radixflow.runtime.scheduling.replica import ReplicaSync

    wire = _Wire()
    return wire, ReplicaSync(wire.end(True), lambda: 0, 1), ReplicaSync(wire.end(False), lambda: 0, 1)


def _req(rid: str):
    from radixflow.runtime.sampling_params import SamplingParams
    from radixflow.runtime.scheduling.req import Req

    return Req(rid=rid, origin_input_ids=[1, 2, 3], sampling=SamplingParams.from_dict({"max_new_tokens": 4}))


def test_step_events_are_pickled_once_as_they_arrive():
    """Rank 0 pickles each call into the step's stream when it is made (a request as it arrived,
    whatever the scheduler does to it after), and the other ranks read the stream back in order."""
    _, leader, follower = _replicas()
    req = _req("a")
    leader.record_add(req)
    req.output_ids.append(7)  # the scheduler touches rank 0's copy after the call
    leader.record("abort", "b")
    leader.record("flush")
    leader.publish_step()
    events = follower.receive_step()
    assert [e[0] for e in events] == ["add", "abort", "flush"] and events[1][1] == "b"
    assert events[0][1].rid == "a" and events[0][1].output_ids == []  # the request itself, as it arrived
    leader.publish_step()
    assert follower.receive_step() == []


def test_grammar_outcomes_send_only_the_rows_that_resolved():
    from types import SimpleNamespace

    from radixflow.runtime.scheduling.grammar_wait import poll_grammars
    from radixflow.runtime.scheduling.req import ReqState

    wire, leader, follower = _replicas()

    def sched(replica, ready: set):
        backend = SimpleNamespace(poll=lambda r, clock=True: True if r.rid in ready else None, wait=lambda reqs, timeout: None,
                                  timeout_s=10.0)
        return SimpleNamespace(pending_grammar=[_req(f"g{i}") for i in range(5)], grammar_backend=backend,
                               replica=replica, waiting=[], running=[1], chunked=None)  # fmt: skip

    rank0, rank1 = sched(leader, {"g3"}), sched(follower, {"g3"})
    poll_grammars(rank0)
    import pickle

    assert pickle.loads(wire.sent[0].payload) == [(3, "g3", True, None)]  # one row, not five
    poll_grammars(rank1)
    for s in (rank0, rank1):
        assert [r.rid for r in s.waiting] == ["g3"] and s.waiting[0].state == ReqState.WAITING
        assert [r.rid for r in s.pending_grammar] == ["g0", "g1", "g2", "g4"]
