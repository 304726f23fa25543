"""Overlapped extend passes: an extend pass's first tokens are read back after the next pass is launched.

An extend pass is otherwise synchronous: the host waits for its sampled ids, advances its requests,
then admits and builds the next batch while the GPU idles. With overlap scheduling on, the requests
whose prompts end in the pass are sampled on the GPU and join `running` at once (so admission counts
them), and their sampled ids are read back by the next step: at its start when they have already
reached the host, else right after it launches its pass (an extend pass, or the first decode pass, which
takes those rows' inputs from the device: overlap.start_decode; where a row cannot overlap, the read-back
comes first). Until then no host code reads their first token: an extend batch holds only waiting or
chunked requests. The tokens, stops and outputs are those of the synchronous path.

A pass's input logprobs (a select's scoring requests, a prompt's logprobs) are read back the same way; the
requests whose prompts end in the pass without generating (max_new_tokens 0) are retired at once, so their KV
goes into the tree, but finish only at the read-back, when their logprobs are in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import torch

from radixflow.host_copy import copy_to_host
from radixflow.runtime.scheduling.logprobs import PendingInputs
from radixflow.runtime.scheduling.req import Req
from radixflow.runtime.scheduling.sampler import SampleResult

if TYPE_CHECKING:
    from radixflow.runtime.scheduling.scheduler import Scheduler


@dataclass
class PendingExtend:
    """The sampled first tokens of an extend pass's finishing requests, and its input logprobs, not yet read back."""

    reqs: list[Req]  # sampled (possibly none)
    result: Optional[SampleResult]  # next_ids on the device
    host_ids: Optional[torch.Tensor]  # their host copy, valid once `ready` has completed
    ready: Optional[torch.cuda.Event] = None  # the pass's last copy: when it has completed, every copy has
    inputs: Optional[PendingInputs] = None
    prompt_only: list[Req] = field(default_factory=list)  # retired, finished by the read-back

    def finish_inputs(self) -> list[Req]:
        """Apply the input logprobs and finish the prompt-only requests; returns those finished."""
        if self.inputs is not None:
            self.inputs.apply()
        return finish_prompt_only(self.prompt_only)


def finish_prompt_only(reqs: list[Req]) -> list[Req]:
    """Finish requests whose prompts are computed and that generate nothing (max_new_tokens 0)."""
    for req in reqs:
        req.finish({"type": "length", "length": 0})
    return reqs


def defers_extends(sched: Scheduler) -> bool:
    """Whether extend passes are read back a step late: overlap scheduling on, and no replicated tensor
    parallelism. Replicated schedulers must take the same decisions on every rank, and the early read-back
    (`tokens_arrived`) follows each rank's own GPU progress; the deferral is also untested there."""
    return sched.overlap and sched.replica is None


def tokens_arrived(pending: Optional[PendingExtend]) -> bool:
    """Whether a pending pass's tokens are already on the host (its copy's event has completed), so the
    next step can read them back at once instead of after building and launching its own pass."""
    return pending is not None and pending.ready is not None and pending.ready.query()


def sample_deferred(sched: Scheduler, reqs: list[Req], logits: Optional[torch.Tensor],
                    inputs: Optional[PendingInputs] = None, prompt_only: tuple | list = ()) -> PendingExtend:
    """Sample `reqs`' first tokens (if any) and start copying them to the host; nothing here waits for the GPU."""
    if not reqs:
        assert inputs is not None, "an extend pass defers its sampled tokens, its input logprobs or both"
        return PendingExtend([], None, None, inputs.ready, inputs, list(prompt_only))
    result = sched.sample(logits, reqs)
    return PendingExtend(reqs, result, *copy_to_host(result.next_ids), inputs=inputs, prompt_only=list(prompt_only))
