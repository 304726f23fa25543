"""Mixed passes (`--enable-mixed-chunk`, SGLang's flag): the running requests' next tokens ride in the extend
pass of newly admitted prompts, so one pass reads the weights for both, where an extend pass and the next
decode pass would each read them; and decoding requests do not wait a pass for the prompts.

A step is mixed when no admitted prompt wants input logprobs, every one that ends in this pass samples an
output, and the running requests can take a pass now: with a decode pass in flight, each one's next input is
that pass's sample (still on the device: overlap.py); with none, each holds its next tokens on the host. The
pass has one logits row for each running request and each prompt that ends in it (a chunk that does not end a
prompt has none), and is sampled and read back as a decode pass is. Otherwise the step runs as it would without
the flag. Rows go through the extend attention (a decode row is a one-token extend)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Optional

import torch

from radixflow.host_copy import to_device_async
from radixflow.runtime.execution.forward_batch import ForwardMode
from radixflow.runtime.scheduling.forward_inputs import build_forward_batch, concat_ranges, pending_tokens
from radixflow.runtime.scheduling.overlap import InflightDecode, chain_rows, chained_ids, sample_and_read_back, sample_flight
from radixflow.runtime.scheduling.req import Req

if TYPE_CHECKING:
    from radixflow.runtime.scheduling.scheduler import Scheduler


def run_mixed(sched: Scheduler, batch: list[tuple[Req, int]]) -> Optional[list[Req]]:
    """One mixed pass of `batch` (admitted (request, tokens) pairs, slots allocated) and the running requests;
    returns the requests read back, or None (nothing done) where the step cannot be mixed."""
    if not sched.running or sched.replica is not None or sched.pending_extend is not None:
        return None
    if any(r.needs_input_logprobs or (r.kv_len + n == r.seq_len and r.sampling.max_new_tokens == 0) for r, n in batch):
        return None
    if sched.inflight is None:
        return _from_host(sched, batch)
    rows = chain_rows(sched)
    if rows is None or any(rows[3]):  # a row with host-side tokens: fed one a pass by decode passes (overlap.py)
        return None
    prev, keep, reqs, pending = rows
    ids = chained_ids(prev, keep, reqs, pending)
    locs = sched.kv.alloc_decode(reqs)
    assert locs is not None, "decode room was checked"
    flight = _launch(sched, batch, reqs, [1] * len(reqs), ids, torch.tensor([r.kv_len for r in reqs]), locs)
    prompts = [1] * (len(flight.reqs) - len(reqs))  # the prompts' inputs were on the host (any count >= 1 reads so)
    touched = sample_and_read_back(sched, flight, flight.reqs, pending + prompts, lambda: sched.read_back(prev))
    sched.inflight = flight
    return touched


def _from_host(sched: Scheduler, batch: list[tuple[Req, int]]) -> Optional[list[Req]]:
    """The mixed pass when no decode pass is in flight: every running request's next tokens are on the host."""
    reqs = list(sched.running)
    ext = [r.seq_len - r.kv_len for r in reqs]
    if min(ext) < 1 or not sched.room_for(reqs):  # no room: the decode step retracts requests first
        return None
    ids, positions, locs, _ = pending_tokens(sched.kv, reqs, ext)
    flight = _launch(sched, batch, reqs, ext, ids, positions, locs)
    sample_flight(sched, flight, [True] * len(flight.reqs))
    if sched.overlap:  # read back by the next step, after it launches its pass from these ids
        sched.inflight = flight
        return []
    return sched.read_back(flight)


def _launch(sched: Scheduler, batch: list[tuple[Req, int]], reqs: list[Req], ext: list[int], ids, positions: torch.Tensor,
            locs: torch.Tensor) -> InflightDecode:
    """Launch the pass of the running `reqs` (`ext` tokens each: `ids`, a list, or on the device; their positions
    and slots) followed by the admitted `batch`; the prompts that end in it join `running` (a chunk that does not
    end its prompt has no logits row and stays the scheduler's `chunked`)."""
    new, new_ext = [r for r, _ in batch], [n for _, n in batch]
    ends = [r.kv_len + n == r.seq_len for r, n in batch]
    new_ids = list(itertools.chain.from_iterable(r.token_range(r.kv_len, r.kv_len + n) for r, n in batch))
    new_locs = sched.kv.req_to_token.read_spans([(r.req_pool_idx, r.kv_len, r.kv_len + n) for r, n in batch])
    if isinstance(ids, list):
        ids = ids + new_ids
    else:
        ids = torch.cat([ids, to_device_async(torch.tensor(new_ids, dtype=ids.dtype), ids.device)])
    has_row = [True] * len(reqs) + ends
    rows = [[end - 1] if row else [] for end, row in zip(itertools.accumulate(ext + new_ext), has_row)]
    sampled = reqs + [r for r, e in zip(new, ends) if e]
    reqs, ext = reqs + new, ext + new_ext
    positions = torch.cat([positions.to(torch.int64), concat_ranges([r.kv_len for r in new], new_ext)])
    fb = build_forward_batch(sched.device, ForwardMode.EXTEND, ids, positions, torch.cat([locs.to(torch.int64), new_locs]),
                             list(zip(reqs, ext)), [r.kv_len for r in reqs], ext, rows)  # fmt: skip
    logits = sched.runner.forward(fb)
    for r, n in zip(reqs, ext):
        r.kv_len += n
    for r in new:
        sched.kv.cache_unfinished(r)  # share the prompt's KV at once, as an extend pass does
    sched.running += [r for r, e in zip(new, ends) if e]
    sched.stats.forward_steps += 1
    sched.stats.mixed_steps += 1
    sched.stats.extend_tokens += sum(new_ext)
    sched.decode_launched()
    return InflightDecode(sampled, logits)
