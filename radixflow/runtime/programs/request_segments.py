"""A request graph's gen that follows another runs as a new *segment* of the finished
request (program_executor's continue hook): the text piece between them is appended to
the request's tokens and the next gen's sampling params take over, so its KV is kept."""

from __future__ import annotations

import time

from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.scheduling.req import Req


def continuable(sp: SamplingParams) -> bool:
    """Whether a gen can run as a new segment of the finished request. Per-request state
    (grammar matcher, penalty counts) and a seed (keyed by output position) need a fresh
    request, and n > 1 samples run as requests of their own, as does a prefill only (max_new_tokens 0)."""
    return (
        sp.n == 1
        and sp.max_new_tokens > 0
        and sp.grammar is None
        and sp.sampling_seed is None
        and not sp.frequency_penalty
        and not sp.presence_penalty
        and sp.repetition_penalty == 1.0
        and not sp.logit_bias
    )


def continues_after(ops: list, pc: int) -> bool:
    """Whether the gen at ops[pc] may go on as the next gen's segment: only text lies between
    it and a continuable gen. Its request is made `continuable` only then, because a
    continuable request's overlapped passes are sampled after the read-back (scheduling/overlap.py)."""
    i = pc + 1
    while i < len(ops) and ops[i].kind in ("text", "var"):
        i += 1
    return i < len(ops) and ops[i].kind == "gen" and continuable(ops[i].sampling)


def start_segment(req: Req, tokens: list, sampling: SamplingParams, stats) -> None:
    """Append the next text piece's tokens to the finished request and let it generate
    again; the scheduler's stats count it as a new request's prompt that finds all the
    request's KV already cached."""
    stats.prompt_tokens += req.seq_len + len(tokens)
    stats.cached_tokens += req.kv_len
    req.output_ids.extend(tokens)
    req.segment_start = len(req.output_ids)
    req.sampling = sampling
    req.grammar = None
    req.output_counts = None
    req.finish_reason = None
    req.created, req.jump_forward_tokens = time.time(), 0  # the gen's own meta_info counts from its segment's start
    req.segment_retractions = req.num_retractions


def common_prefix(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
