"""A tensor-parallel rank > 0 waits for its own compile of a grammar rank 0 has compiled
(grammar_wait._follow) within a bound: a compile that never comes (no job on this rank, a job that
never finishes) or a request that is not the one rank 0 decided fails the rank with TPDivergedError,
which rank 0 reports (test_tp_replicated.py: a failed rank fails the Engine), instead of hanging both
ranks (rank 0 in the next pass's collective)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from test_grammar_backends import FakeReq, _backend
from test_tp_replicated import _replicas, _req


class _Stub:
    """A grammar backend whose compiles resolve only when a test says so."""

    def __init__(self, ready: set, jobs: bool = True, timeout_s: float = 0.1):
        self.ready, self.jobs, self.timeout_s = ready, jobs, timeout_s
        self.polls = 0

    def poll(self, req, clock=True):
        self.polls += 1
        return True if req.rid in self.ready else None

    def wait(self, reqs, timeout):
        time.sleep(timeout)

    def has_job(self, req):
        return self.jobs

    def job_state(self, req):
        return "its compile has run for 1.0 s"


def _ranks(rank0_ready: set, rank1: _Stub, rids=("g0", "g1")):
    """Rank 0 polls and publishes its outcomes; returns rank 1's scheduler, to poll after it."""
    from radixflow.runtime.scheduling.grammar_wait import poll_grammars

    _, leader, follower = _replicas()

    def sched(replica, backend, names):
        return SimpleNamespace(pending_grammar=[_req(r) for r in names], grammar_backend=backend, replica=replica,
                               waiting=[], running=[1], chunked=None)  # fmt: skip

    poll_grammars(sched(leader, _Stub(rank0_ready), ("g0", "g1")))
    return sched(follower, rank1, rids)


def _follow_in_thread(sched, limit_s: float):
    """rank 1's poll_grammars, in a thread (the unbounded wait this guards against would never return):
    what it raised, or None if it returned; fails the test if it is still waiting after `limit_s`."""
    from radixflow.runtime.scheduling.grammar_wait import poll_grammars

    out: list = []

    def run():
        try:
            poll_grammars(sched)
            out.append(None)
        except Exception as e:  # noqa: BLE001 - the test reads it
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit_s)
    if t.is_alive():
        sched.grammar_backend.ready.add("g1")  # let the thread end
        pytest.fail(f"rank 1 was still waiting for the grammar after {limit_s} s")
    return out[0]


def test_a_grammar_that_never_compiles_on_rank_1_fails_it_within_a_bound():
    from radixflow.runtime.scheduling.grammar_wait import FOLLOW_LIMIT_FACTOR
    from radixflow.runtime.scheduling.replica import TPDivergedError

    rank1 = _Stub(set(), timeout_s=0.1)  # rank 1's compile of g1 never finishes
    start = time.monotonic()
    err = _follow_in_thread(_ranks({"g1"}, rank1), 10)
    assert isinstance(err, TPDivergedError), err
    assert f"request g1 compiled on rank 0 but not on this rank within {FOLLOW_LIMIT_FACTOR * 0.1:g} s" in str(err)
    assert "its compile has run for" in str(err)
    assert FOLLOW_LIMIT_FACTOR * 0.1 <= time.monotonic() - start < 5 and rank1.polls > 1


def test_a_grammar_rank_1_has_no_compile_of_fails_it_at_once():
    from radixflow.runtime.scheduling.replica import TPDivergedError

    rank1 = _Stub(set(), jobs=False, timeout_s=60)
    start = time.monotonic()
    err = _follow_in_thread(_ranks({"g1"}, rank1), 10)
    assert isinstance(err, TPDivergedError) and "compiled on rank 0; this rank has no compile job for it" in str(err), err
    assert time.monotonic() - start < 2


def test_rank_1_catches_up_with_a_slower_compile_of_its_own():
    rank1 = _Stub(set(), timeout_s=10)
    sched = _ranks({"g1"}, rank1)
    threading.Timer(0.3, lambda: rank1.ready.add("g1")).start()  # rank 1's compile ends 0.3 s after rank 0's
    assert _follow_in_thread(sched, 10) is None
    assert [r.rid for r in sched.waiting] == ["g1"] and [r.rid for r in sched.pending_grammar] == ["g0"]


def test_rank_0_deciding_another_request_than_rank_1_has_is_a_divergence():
    from radixflow.runtime.scheduling.grammar_wait import poll_grammars
    from radixflow.runtime.scheduling.replica import TPDivergedError

    with pytest.raises(TPDivergedError, match="grammar of request g1 where this rank has request x1"):
        poll_grammars(_ranks({"g1"}, _Stub({"g1", "x1"}), rids=("g0", "x1")))
    with pytest.raises(TPDivergedError, match="resolved pending grammar #1; this rank has 1 pending"):
        poll_grammars(_ranks({"g1"}, _Stub({"g1"}), rids=("g0",)))


def test_the_follower_poll_takes_no_time_limit_of_its_own(engine):
    """Rank 1 polls without its compile clock: past --grammar-compile-timeout-s its compile is still
    awaited (its wait is bounded by _follow), where rank 0's poll fails the request."""
    backend = _backend(engine, grammar_compile_workers=1, grammar_compile_timeout_s=0.05)
    gate = threading.Event()
    try:
        backend.impl  # the backend itself is built on the pool first
        backend.cache.pool.submit(gate.wait, 30)  # the only worker is busy: the compile below starts late
        req = FakeReq("regex", "[0-9]{3}")
        backend.submit(req)
        time.sleep(0.2)
        assert backend.poll(req, clock=False) is None and req.finish_reason is None
        assert backend.has_job(req) and "waited" in backend.job_state(req)
        gate.set()
        deadline = time.monotonic() + 60
        while (ready := backend.poll(req, clock=False)) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ready is True and req.grammar is not None and not backend.has_job(req)
        assert backend.job_state(req) == "this rank has no compile job for it"
    finally:
        gate.set()
        backend.cache.pool.shutdown(wait=False)
