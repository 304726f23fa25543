"""Overlapped decode: pass n+1 is launched before pass n is read back.

A launched pass keeps its sampled ids on the GPU; the next step launches the following
forward pass from them first, and only then reads them back and does the per-request work
(stop checks, grammars, outputs), so the GPU does not wait for the host between steps.

Rows whose sampling reads the host's view of the previous token (grammar masks, penalty
counts, the min_new_tokens stop mask) still overlap: their pass's forward is launched
first, and it is sampled once the previous pass has been read back. While the GPU runs the
forward pass, each grammar advances by the previous token and the masks are filled into one
pinned bitmask, copied asynchronously and applied right before sampling.

Tokens a request holds on the host (a jump-forward's forced tokens) are fed one a pass, so
every pass stays a decode pass (CUDA graphs): such a row's sample is dropped until its last
pending token is fed. A row that jumps while its next pass is already launched drops that
pass's sample too. Up to MAX_FED_TOKENS pending tokens ride this way; more, or the text of a
request graph's next segment (two or more tokens), make the scheduler drain and run one extend pass.
So does a batch in which every row holds two or more pending tokens and none is a grammar's
(feeds_only: a request graph's last segment, whose prompt text would otherwise be fed a token a
pass, every sample dropped).

A request graph's segment that the next gen continues overlaps while it decodes, sampled after the
read-back (needs_host_view): a read-back may continue it (its text appended, its outputs trimmed
back to a stop string, the next gen's sampling params), which the pass launched before then must
not sample for. Before, such a segment ran without overlap: every pass of a multi-gen program's
earlier gens waited for the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import torch

from radixflow.host_copy import copy_to_host, to_device_async
from radixflow.runtime.execution.forward_batch import ForwardMode
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.scheduling.forward_inputs import build_forward_batch
from radixflow.runtime.scheduling.req import Req
from radixflow.runtime.scheduling.sampler import SampleResult
from radixflow.runtime.server_args import MAX_FED_TOKENS

if TYPE_CHECKING:
    from radixflow.runtime.scheduling.scheduler import Scheduler

# stand-ins that sample a row whose token is dropped: greedy, or sampled when the batch samples
# (so a sampled batch does not also pay for greedy rows)
IDLE_GREEDY = Req(rid="", origin_input_ids=[], sampling=SamplingParams(temperature=0.0))
IDLE_SAMPLED = Req(rid="", origin_input_ids=[], sampling=SamplingParams(temperature=1.0))


@dataclass
class InflightDecode:
    """A decode pass launched but not yet read back."""

    reqs: list
    logits: Optional[torch.Tensor]  # until sampled
    real: Optional[list] = None  # per row: its sample is the request's next token (else it is dropped)
    result: Optional[SampleResult] = None  # next_ids on the device: the next pass's input
    host_ids: Optional[torch.Tensor] = None  # [B] their host copy, valid once `ready` has completed
    ready: Optional[torch.cuda.Event] = None


def overlappable(req: Req, pending: int) -> bool:
    """Whether a pass for `req` may launch before the previous one is read back; `pending`:
    its host-side tokens without KV (0: its next input is on the device). A continuable request
    (a request graph's gen that the next gen continues) takes no more than one fed token: its next
    segment's text is one extend pass, as without overlap."""
    return pending <= (1 if req.continuable else MAX_FED_TOKENS)


def feeds_only(reqs: list[Req], pending: list[int]) -> bool:
    """Whether a decode pass over `reqs` would sample no row: each holds two or more host-side tokens
    (`pending`) and none is a grammar's, so they are the prompt text of a request graph's next segment.
    One extend pass (the scheduler's decode step without overlap) then computes them all, where feeding
    them would run as many passes as the longest holds, all their samples dropped. A grammar's forced
    tokens keep riding along (jump_policy's limits count on it)."""
    return bool(reqs) and all(n >= 2 and r.grammar is None for r, n in zip(reqs, pending))


def needs_host_view(req: Req) -> bool:
    """Rows whose sampling reads the host's view of the previous token (or of the request: a
    continuable request's read-back may start its next segment)."""
    s = req.sampling
    return (
        req.grammar is not None
        or req.continuable
        or s.frequency_penalty != 0 or s.presence_penalty != 0 or s.repetition_penalty != 1.0
        or req.segment_len <= s.min_new_tokens
    )  # fmt: skip


def launch_decode(sched: Scheduler, reqs: list[Req], ids=None) -> InflightDecode:
    """Launch one decode pass, unsampled; `ids` (on the device) are its input tokens, else
    each request's first pending token. Nothing here waits for the GPU."""
    prefix = [r.kv_len for r in reqs]
    locs = sched.kv.alloc_decode(reqs)
    assert locs is not None, "decode room was checked"
    ids = [r.pending_ids()[0] for r in reqs] if ids is None else ids
    positions = torch.tensor(prefix, dtype=torch.int64)
    fb = build_forward_batch(sched.device, ForwardMode.DECODE, ids, positions, locs, [(r, 1) for r in reqs], prefix,
                             [1] * len(reqs), [[i] for i in range(len(reqs))])  # fmt: skip
    logits = sched.runner.forward(fb)
    for r in reqs:
        r.kv_len += 1
    sched.decode_launched()
    return InflightDecode(reqs, logits)


def sample_flight(sched: Scheduler, flight: InflightDecode, real: list, continued: int = 0) -> None:
    """Sample a launched pass and start copying its ids to the host. Rows that are not
    `real` (finished meanwhile, only feeding a pending token, or `continued`: that many rows'
    requests started their next segment in the read-back) sample as idle greedy rows."""
    sampled = any(ok and not r.sampling.is_greedy for r, ok in zip(flight.reqs, real))
    idle = IDLE_SAMPLED if sampled else IDLE_GREEDY
    rows = [r if ok else idle for r, ok in zip(flight.reqs, real)]
    sched.stats.fed_rows += sum(not ok and not r.finished for r, ok in zip(flight.reqs, real)) - continued
    sched.stats.continued_rows += continued
    result = sched.sample(flight.logits, rows)
    flight.logits, flight.real, flight.result = None, real, result
    flight.host_ids, flight.ready = copy_to_host(result.next_ids)


def start_decode(sched: Scheduler) -> tuple[Optional[InflightDecode], list[Req]]:
    """The first overlapped pass over the running requests (no decode pass in flight), and the requests
    read back: a pending extend pass's rows take their first tokens from the device, and it is read back
    once this pass is launched. (None, []) when a request cannot overlap: nothing launched or read back."""
    reqs = list(sched.running)
    pending = [r.seq_len - r.kv_len for r in reqs]  # 0: a pending extend pass's row
    if not all(overlappable(r, n) for r, n in zip(reqs, pending)) or feeds_only(reqs, pending):
        return None, []
    if not sched.room_for(reqs):
        return None, []
    flight = launch_decode(sched, reqs, _first_ids(sched.pending_extend, reqs, pending))
    return flight, sample_and_read_back(sched, flight, reqs, pending, sched._read_back_extend)


def _first_ids(ext, reqs: list[Req], pending: list[int]) -> Optional[torch.Tensor]:
    """The first pass's input ids: a row's first host-side pending token, or, for the rows of the pending
    extend pass `ext`, its sampled token still on the device. None: every input is on the host."""
    if ext is None or not ext.reqs:
        return None
    row = {id(r): i for i, r in enumerate(ext.reqs)}
    assert all(n or id(r) in row for r, n in zip(reqs, pending)), "a row with no host-side token is the extend pass's"
    ids = ext.result.next_ids
    at, host = to_device_async(torch.tensor([[row.get(id(r), 0) for r in reqs],  # one copy for both rows
                                             [r.pending_ids()[0] if n else -1 for r, n in zip(reqs, pending)]]), ids.device)
    return torch.where(host >= 0, host, ids[at])


def chain_decode(sched: Scheduler) -> Optional[list[Req]]:
    """Launch the next pass from the in-flight pass's ids, then read those back (for a batch
    with rows that need the host's view: read back, then sample). Returns the requests read
    back; None (nothing launched) when the in-flight pass must be drained first."""
    rows = chain_rows(sched) if sched.chunked is None else None  # a prompt's next chunk runs first
    if rows is None:
        return None
    prev, keep, reqs, pending = rows
    flight = launch_decode(sched, reqs, chained_ids(prev, keep, reqs, pending))
    sched.stats.chained_decode_steps += 1
    touched = sample_and_read_back(sched, flight, reqs, pending, lambda: sched.read_back(prev))
    sched.inflight = flight
    return touched


def chain_rows(sched: Scheduler) -> Optional[tuple[InflightDecode, list, list[Req], list[int]]]:
    """What a pass launched behind the in-flight one takes from it: (that pass, the indices of its unfinished
    rows, their requests, each one's host-side pending tokens); None when it must be drained first."""
    prev = sched.inflight
    keep = [i for i, r in enumerate(prev.reqs) if not r.finished]  # finished: aborted meanwhile
    reqs = [prev.reqs[i] for i in keep]
    pending = [r.seq_len - r.kv_len for r in reqs]
    if not reqs or not sched.room_for(reqs):
        return None
    if not all(overlappable(r, n) for r, n in zip(reqs, pending)) or feeds_only(reqs, pending):
        return None
    assert all((n == 0) == prev.real[i] for i, n in zip(keep, pending)), "a real row's next input is on the device"
    return prev, keep, reqs, pending


def sample_and_read_back(sched: Scheduler, flight: InflightDecode, reqs: list[Req], pending: list[int],
                          read_back: Callable[[], list[Req]]) -> list[Req]:
    """Sample a just-launched pass and read back the pass before it (`pending`: each row's host-side tokens
    before the launch; 0: its input was on the device). A batch with rows that need the host's view is read
    back first, then sampled; otherwise sampled first. Returns the requests read back."""
    if any(needs_host_view(r) for r in reqs):
        was = [r.continuable and n == 0 for r, n in zip(reqs, pending)]  # a row the read-back may continue
        touched = read_back()
        real = [not r.finished and r.seq_len == r.kv_len for r in reqs]
        continued = sum(w and not ok and not r.finished for r, w, ok in zip(reqs, was, real))
        sample_flight(sched, flight, real, continued)
        return touched
    sample_flight(sched, flight, [n == 0 or r.seq_len == r.kv_len for r, n in zip(reqs, pending)])
    return read_back()


def chained_ids(prev: InflightDecode, keep: list, reqs: list, pending: list) -> torch.Tensor:
    """The next pass's input ids on the device: the in-flight pass's sample, or the first
    host-side pending token of a request that has some."""
    ids = prev.result.next_ids
    if len(keep) < len(prev.reqs):
        ids = ids[to_device_async(torch.tensor(keep), ids.device)]
    if not any(pending):
        return ids
    host = to_device_async(torch.tensor([r.pending_ids()[0] if n else -1 for r, n in zip(reqs, pending)]), ids.device)
    return torch.where(host >= 0, host, ids)
