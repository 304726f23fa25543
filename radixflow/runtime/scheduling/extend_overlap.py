"""Overlapped extend passes: an extend pass's first tokens are read back after the next pass is launched.

An extend pass is otherwise synchronous: the host waits for its sampled ids, advances its requests,
then admits and builds the next batch while the GPU idles. With overlap scheduling on, the requests
whose prompts end in the pass are sampled on the GPU and join `running` at once (so admission counts
them), and their sampled ids are read back by the next step: at its start when they have already
reached the host, else right after it launches the next extend pass, or before anything else when the
next step has no extend pass to launch. Until then nothing reads their first token: no decode pass
runs before the read-back, and an extend batch holds only waiting or chunked requests. The tokens, stops and outputs are those of the synchronous path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from radixflow.runtime.scheduling.overlap import copy_to_host
from radixflow.runtime.scheduling.req import Req
from radixflow.runtime.scheduling.sampler import SampleResult

if TYPE_CHECKING:
    from radixflow.runtime.scheduling.scheduler import Scheduler


@dataclass
class PendingExtend:
    """The sampled first tokens of an extend pass's finishing requests, not yet read back."""

    reqs: list[Req]
    result: SampleResult  # next_ids on the device
    host_ids: torch.Tensor  # their host copy, valid once `ready` has completed
    ready: Optional[torch.cuda.Event] = None


def defers_extends(sched: Scheduler) -> bool:
    """Whether extend passes are read back a step late: overlap scheduling on, and no replicated tensor
    parallelism. Replicated schedulers must take the same decisions on every rank, and the early read-back
    (`tokens_arrived`) follows each rank's own GPU progress; the deferral is also untested there."""
    return sched.overlap and sched.replica is None


def tokens_arrived(pending: Optional[PendingExtend]) -> bool:
    """Whether a pending pass's tokens are already on the host (its copy's event has completed), so the
    next step can read them back at once instead of after building and launching its own pass."""
    return pending is not None and pending.ready is not None and pending.ready.query()


def sample_deferred(sched: Scheduler, reqs: list[Req], logits: torch.Tensor) -> PendingExtend:
    """Sample `reqs`' first tokens and start copying them to the host; nothing here waits for the GPU."""
    result = sched.sample(logits, reqs)
    return PendingExtend(reqs, result, *copy_to_host(result.next_ids))
