"""Constrained requests wait here while their grammar compiles off the scheduler loop."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from radixflow.runtime.scheduling.replica import TPDivergedError
from radixflow.runtime.scheduling.req import Req, ReqState

if TYPE_CHECKING:
    from radixflow.constrained.backend import GrammarBackend
    from radixflow.runtime.scheduling.scheduler import Scheduler

# A rank > 0 waits at most this many compile time limits (--grammar-compile-timeout-s) for its own compile
# of a grammar rank 0 has compiled, then fails (TPDivergedError: rank 0 learns it from the failure report);
# rank 0 is blocked meanwhile in the next pass's collective. Beyond one limit it covers this rank's compile
# starting late (queued behind other compiles) or running slower than rank 0's on a loaded host.
FOLLOW_LIMIT_FACTOR = 3


def start_grammar_backend(sched: Scheduler) -> GrammarBackend:
    """The scheduler's grammar backend, created on the first constrained request."""
    if sched.grammar_backend is None:
        from radixflow.constrained.backend import GrammarBackend

        on_gpu = str(sched.device).startswith("cuda")  # auto's move to outlines pays where the host bounds a step
        sched.grammar_backend = GrammarBackend(
            sched.tokenizer, sched.runner.vocab_size, sched.eos_ids, sched.args, promote=on_gpu
        )
        # always: besides jump-forward (--disable-jump-forward is the backend's to apply), the
        # hook repairs a sampled token that left no completion within the budget (llguidance)
        sched.jump_forward = sched.grammar_backend.jump_forward
    return sched.grammar_backend


def poll_grammars(sched: Scheduler) -> list[Req]:
    """Move requests whose grammar has compiled to the waiting queue; finish those
    whose grammar failed (the backend sets their finish reason). Returns the failed.
    Under replicated tensor parallelism rank 0's outcomes are every rank's (replica.py)."""
    if not sched.pending_grammar:
        return []
    backend = sched.grammar_backend
    replica = sched.replica
    if replica is None or replica.leader:
        if not (sched.waiting or sched.running or sched.chunked):  # idle: wait, don't spin
            backend.wait(sched.pending_grammar, timeout=0.005)
        outcomes = [backend.poll(req) for req in sched.pending_grammar]  # None: not yet; True: compiled; False: failed
        if replica is not None:  # only the rows that resolved: most steps, none
            replica.decide(lambda: [(i, r.rid, ok, r.finish_reason if ok is False else None)
                                    for i, (r, ok) in enumerate(zip(sched.pending_grammar, outcomes)) if ok is not None])  # fmt: skip
    else:
        resolved = {i: row for i, *row in replica.decide(lambda: None)}
        if resolved and max(resolved) >= len(sched.pending_grammar):
            raise TPDivergedError(f"rank 0 resolved pending grammar #{max(resolved)}; this rank has {len(sched.pending_grammar)} pending")
        deadline = time.monotonic() + FOLLOW_LIMIT_FACTOR * backend.timeout_s  # one bound for the step's rows
        outcomes = [_follow(backend, r, deadline, *resolved[i]) if i in resolved else None
                    for i, r in enumerate(sched.pending_grammar)]  # fmt: skip
    still, failed = [], []
    for req, ready in zip(sched.pending_grammar, outcomes):
        if ready is None:
            still.append(req)
        elif ready:
            req.state = ReqState.WAITING
            sched.waiting.append(req)
        else:
            assert req.finished, "a failed grammar must finish its request"
            req.state = ReqState.FINISHED
            failed.append(req)
    sched.pending_grammar = still
    return failed


def _follow(backend, req: Req, deadline: float, rid: str, ok: bool, reason) -> bool:
    """A rank > 0 takes rank 0's outcome for one pending grammar: it fails the request with rank 0's
    reason, or waits, until `deadline` at most, for its own compile of a grammar that compiled on rank 0."""
    if req.rid != rid:
        raise TPDivergedError(f"rank 0 resolved the grammar of request {rid} where this rank has request {req.rid}")
    if ok is False:
        backend.forget(req)
        req.finish(reason)
        return False
    while (mine := backend.poll(req, clock=False)) is None:
        if not backend.has_job(req):
            raise TPDivergedError(f"the grammar of request {rid} compiled on rank 0; this rank has no compile job for it")
        left = deadline - time.monotonic()
        if left <= 0:
            raise TPDivergedError(f"the grammar of request {rid} compiled on rank 0 but not on this rank within "
                                  f"{FOLLOW_LIMIT_FACTOR * backend.timeout_s:g} s ({backend.job_state(req)})")  # fmt: skip
        backend.wait([req], timeout=min(0.05, left))
    if mine is not True:
        raise TPDivergedError(f"the grammar of request {rid} compiled on rank 0 but failed on this rank: {req.finish_reason}")
    return True
