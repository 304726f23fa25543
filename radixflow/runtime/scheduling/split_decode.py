"""A decode step in which some rows continue with several pending tokens (a request graph's
next text, jump-forward's forced tokens): one extend pass of every row (a mixed pass), or,
while the continuing rows are few, an extend pass of those rows and a decode pass of the rest.

A mixed pass runs every row through the extend path, which on the GPU costs far more than a
decode pass of the rows with one token; split, the two passes are launched back to back and
read back together (one wait for the host)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixflow.runtime.execution.forward_batch import ForwardMode
from radixflow.runtime.scheduling.forward_inputs import build_forward_batch, pending_tokens
from radixflow.runtime.scheduling.overlap import launch_decode, sample_flight
from radixflow.runtime.scheduling.req import Req

if TYPE_CHECKING:
    from radixflow.runtime.scheduling.scheduler import Scheduler

# Split while continuing rows are at most this share of the step's rows. H200, Llama-3-8B, 64 rows
# with 500-token prefixes, 8 new tokens a continuing row (graph_eager_probe, session 11):
# 4 continuing: mixed 17.95 ms, split 12.32; 16: 19.05 vs 15.14; 64: 23.74 vs 23.86 (decode alone 6.5).
# The crossover is near every row continuing; half keeps a margin.
SPLIT_MAX_CONTINUING_SHARE = 0.5


def splits(ext: list[int], reqs: list[Req] | None = None) -> bool:
    """Whether a step whose rows hold `ext` pending tokens each runs as two passes. Jump-forward's
    forced tokens (rows with a grammar) keep riding in the mixed pass: constrained decoding's
    figures (issue 23) were measured that way and the split was not measured with them."""
    continuing = sum(n > 1 for n in ext)
    if reqs is not None and any(n > 1 and r.grammar is not None for r, n in zip(reqs, ext)):
        return False
    return 0 < continuing <= SPLIT_MAX_CONTINUING_SHARE * len(ext)


def run_decode_step(sched: Scheduler, reqs: list[Req], ext: list[int]) -> list[Req]:
    """One pass of every running request, read back at once: a decode pass when each holds one
    pending token, else a mixed pass or (`splits`) an extend pass plus a decode pass."""
    if max(ext) == 1:
        flight = launch_decode(sched, reqs)
        sample_flight(sched, flight, [True] * len(reqs))
        return sched.read_back(flight)
    if not splits(ext, reqs):
        logits = _launch_extend(sched, reqs, ext)
        sched._sample_and_advance(reqs, logits)
        sched.decode_launched()
        return _extended(sched, reqs)
    cont = [(r, n) for r, n in zip(reqs, ext) if n > 1]
    rest = [r for r, n in zip(reqs, ext) if n == 1]
    extended = [r for r, _ in cont]
    logits = _launch_extend(sched, extended, [n for _, n in cont])
    result = sched.sample(logits, extended)  # before the next replay, which may reuse a graph's logits memory
    flight = launch_decode(sched, rest)  # the step's one decode_launched
    sample_flight(sched, flight, [True] * len(rest))  # its ids copy to the host while the extend rows advance
    sched.stats.split_decode_steps += 1
    sched._advance(extended, result.next_ids.tolist(), result)
    return _extended(sched, extended) + sched.read_back(flight)


def _launch_extend(sched: Scheduler, reqs: list[Req], ext: list[int]):
    prefix = [r.kv_len for r in reqs]
    ids, positions, locs, rows = pending_tokens(sched.kv, reqs, ext)
    fb = build_forward_batch(sched.device, ForwardMode.EXTEND, ids, positions, locs, list(zip(reqs, ext)), prefix, ext, rows)
    logits = sched.runner.forward(fb)
    for r, n in zip(reqs, ext):
        r.kv_len += n
    return logits


def _extended(sched: Scheduler, reqs: list[Req]) -> list[Req]:
    sched.running = [r for r in sched.running if not r.finished]
    sched.stats.decode_tokens += len(reqs)
    return reqs
