"""Constrained requests wait here while their grammar compiles off the scheduler loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixflow.runtime.scheduling.req import Req, ReqState

if TYPE_CHECKING:
    from radixflow.constrained.backend import GrammarBackend
    from radixflow.runtime.scheduling.scheduler import Scheduler


def start_grammar_backend(sched: Scheduler) -> GrammarBackend:
    """The scheduler's grammar backend, created on the first constrained request."""
    if sched.grammar_backend is None:
        from radixflow.constrained.backend import GrammarBackend

        sched.grammar_backend = GrammarBackend(sched.tokenizer, sched.runner.vocab_size, sched.eos_ids, sched.args)
        # always: besides jump-forward (--disable-jump-forward is the backend's to apply), the
        # hook repairs a sampled token that left no completion within the budget (llguidance)
        sched.jump_forward = sched.grammar_backend.jump_forward
    return sched.grammar_backend


def poll_grammars(sched: Scheduler) -> list[Req]:
    """Move requests whose grammar has compiled to the waiting queue; finish those
    whose grammar failed (the backend sets their finish reason). Returns the failed."""
    if not sched.pending_grammar:
        return []
    backend = sched.grammar_backend
    if not (sched.waiting or sched.running or sched.chunked):  # idle: wait, don't spin
        backend.wait(sched.pending_grammar, timeout=0.005)
    still, failed = [], []
    for req in sched.pending_grammar:
        ready = backend.poll(req)  # None: not yet; True: compiled; False: failed
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
