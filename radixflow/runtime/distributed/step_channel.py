"""One ordered stream of messages from rank 0 to the other ranks (replicated scheduling).

Every rank runs the same scheduler (scheduling/replica.py); rank 0 publishes only what the
others cannot compute themselves (the requests that arrived before a step, which grammars
finished compiling, a request graph's next segment) plus a digest of each decision, and the
other ranks read the messages at the same points of the same code. A message is a fixed
int64 header `[kind, digest, payload bytes]` and, when there is one, a byte payload, both
broadcast on a gloo group of their own. Rank 0 never waits: its broadcasts are queued
(async_op) and reaped later, so only ranks that are ahead of rank 0 wait for it, which they
would do at the pass's first all-reduce anyway.

`agree_ids` is the one collective a step adds on the device group: rank 0's sampled ids
overwrite every rank's, in place, without a host sync.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from radixflow.runtime.distributed.tp_group import TPContext

STOP, STEP, PASS, DECIDE = 0, 1, 2, 3
KIND_NAMES = {STOP: "stop", STEP: "step", PASS: "pass", DECIDE: "decision"}
DIGEST_MASK = (1 << 62) - 1  # digests fit an int64
MAX_QUEUED = 64  # rank 0's broadcasts not yet reaped; past this it waits for the oldest


@dataclass
class Message:
    kind: int
    digest: int
    payload: bytes = b""


@dataclass
class StepChannel:
    tp: TPContext
    _queued: deque = field(default_factory=deque)  # rank 0: (work, tensors kept alive until it completes)

    @property
    def group(self):
        return self.tp.step_group

    def publish(self, kind: int, digest: int, payload: bytes = b"") -> None:
        """Rank 0: queue one message for every other rank; returns at once."""
        header = torch.tensor([kind, digest & DIGEST_MASK, len(payload)], dtype=torch.int64)
        self._queue(header)
        if payload:
            self._queue(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
        while self._queued and (len(self._queued) > MAX_QUEUED or self._queued[0][0].is_completed()):
            work, _ = self._queued.popleft()
            work.wait()

    def _queue(self, t: torch.Tensor) -> None:
        self._queued.append((dist.broadcast(t, src=0, group=self.group, async_op=True), t))

    def receive(self) -> Message:
        """Ranks > 0: the next message, waiting for rank 0 as long as it takes."""
        header = torch.empty(3, dtype=torch.int64)
        dist.broadcast(header, src=0, group=self.group)
        kind, digest, size = header.tolist()
        payload = b""
        if size:
            buf = torch.empty(size, dtype=torch.uint8)
            dist.broadcast(buf, src=0, group=self.group)
            payload = buf.numpy().tobytes()
        return Message(kind, digest, payload)

    def flush(self) -> None:
        """Rank 0: wait until every queued message has gone out (before a shutdown)."""
        while self._queued:
            self._queued.popleft()[0].wait()


def send_stop(tp: TPContext) -> None:
    """Rank 0: tell the other ranks' schedulers to stop (after every message before it)."""
    channel = StepChannel(tp)
    channel.publish(STOP, 0)
    channel.flush()


def agree_ids(ids: torch.Tensor, tp: TPContext) -> None:
    """Every rank takes rank 0's sampled ids (in place, on the device group, queued without a sync)."""
    if tp.size > 1:
        dist.broadcast(ids, src=0, group=tp.device_group)
