"""Overlapped extend passes: an extend pass's first tokens are read back after the next pass is launched.

An extend pass is otherwise synchronous: the host waits for its sampled ids, advances its requests,
then admits and builds the next batch while the GPU idles. With overlap scheduling on, the requests
whose prompts end in the pass are sampled on the GPU and join `running` at once (so admission counts
them), and their sampled ids are read back by the next step: right after it launches the next extend
pass, or before anything else when the next step has no extend pass to launch. Until then nothing
reads their first token: no decode pass runs before the read-back, and an extend batch holds only
waiting or chunked requests. The tokens, stops and outputs are those of the synchronous path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from radixflow.runtime.scheduling.req import Req
from radixflow.runtime.scheduling.sampler import SampleResult

if TYPE_CHECKING:
    from radixflow.runtime.scheduling.scheduler import Scheduler


@dataclass
class PendingExtend:
    """The sampled first tokens of an extend pass's finishing requests, not yet read back."""

    reqs: list
    result: SampleResult  # next_ids on the device
    host_ids: torch.Tensor  # their host copy, valid once `ready` has completed
    ready: Optional[torch.cuda.Event] = None


def defers_extends(sched: Scheduler) -> bool:
    """Whether extend passes are read back a step late: overlap scheduling on, and one scheduler (under
    replicated tensor parallelism every rank's sampling agrees through a collective, kept in step order)."""
    return sched.overlap and sched.replica is None


def sample_deferred(sched: Scheduler, reqs: list[Req], logits: torch.Tensor) -> PendingExtend:
    """Sample `reqs`' first tokens and start copying them to the host; nothing here waits for the GPU."""
    result = sched.sample(logits, reqs)
    pending = PendingExtend(reqs, result, result.next_ids.to("cpu", non_blocking=True))
    if result.next_ids.is_cuda:
        pending.ready = torch.cuda.Event()
        pending.ready.record()
    return pending
