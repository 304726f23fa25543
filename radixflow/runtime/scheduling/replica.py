"""Replicated scheduling under tensor parallelism (`--tp-scheduler replicated`, the default).

Every rank runs this same Scheduler over the same inputs, so no rank waits for another's host
work and no pass is shipped between ranks: the only cross-rank traffic of a step is the
model's all-reduces, one small broadcast of the sampled ids, and rank 0's messages below,
which rank 0 queues without waiting (distributed/step_channel.py).

The scheduler is deterministic given its inputs. Its inputs are what rank 0 decides from
outside the step or from the clock, and rank 0 publishes each one where it is decided; the
other ranks take it at the same point of the same code:
- at the start of each step, the calls made since the last one (`add_request` with the request
  as it arrived, `abort`, `flush_cache`), applied in their order;
- which pending grammars finished compiling (compile time is the clock's);
- what a request graph's continue hook did to a finished request (the program executor runs
  on rank 0 only).
Sampled ids agree because every rank takes rank 0's (`agree_ids`, on the device group, no
host sync), whatever its own logits' last bits or random state.

Each forward pass updates a digest of the decision (mode, lengths, free KV slots, and every
`check_every` passes the input ids, which hold every sampled token); every message carries
rank 0's digest and a rank whose own differs raises `TPDivergedError` before it runs a
collective that would not match.
"""

from __future__ import annotations

import io
import os
import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from radixflow import env
from radixflow.runtime.distributed.step_channel import DECIDE, DIGEST_MASK, KIND_NAMES, PASS, STEP, STOP, StepChannel
from radixflow.runtime.execution.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from radixflow.runtime.scheduling.req import Req
    from radixflow.runtime.scheduling.scheduler import Scheduler

class TPDivergedError(RuntimeError):
    """A rank's scheduler made a different decision than rank 0's."""


@dataclass
class ReplicaSync:
    channel: StepChannel
    free_slots: Callable[[], int]
    check_every: int
    digest: int = 0
    passes: int = 0
    events: Optional[io.BytesIO] = None  # rank 0: the calls since the last step, pickled as they come
    drop_prefix: Optional[str] = None  # tests: a rank > 0 drops requests whose rid starts so

    @property
    def leader(self) -> bool:
        return self.channel.tp.is_leader

    # -- the step's inputs ---------------------------------------------------------------------------
    def record_add(self, req: Req) -> None:
        self.record("add", req)  # pickled as it arrives, before the scheduler touches it

    def record(self, kind: str, *args: Any) -> None:
        """Rank 0: append one call to the step's stream, pickled once, now."""
        if self.leader:
            if self.events is None:
                self.events = io.BytesIO()
            pickle.dump((kind, *args), self.events, pickle.HIGHEST_PROTOCOL)

    def publish_step(self) -> None:
        """Rank 0, at the start of a step."""
        payload = b"" if self.events is None else self.events.getvalue()
        self.events = None
        self.channel.publish(STEP, self.digest, payload)

    def receive_step(self) -> Optional[list]:
        """Ranks > 0: the calls to apply before the next step, or None when rank 0 says stop."""
        msg = self.channel.receive()
        if msg.kind == STOP:
            return None
        self._check(msg, STEP)
        stream, events = io.BytesIO(msg.payload), []
        while stream.tell() < len(msg.payload):
            events.append(pickle.load(stream))
        return events

    def apply(self, sched: Scheduler, events: list) -> None:
        for kind, *args in events:
            if kind == "add":
                req = args[0]
                if not (self.drop_prefix and req.rid.startswith(self.drop_prefix)):
                    sched.add_request(req)
            elif kind == "abort":
                sched.abort(args[0])
            else:
                assert kind == "flush", kind
                sched.flush_cache()

    # -- decisions inside a step -----------------------------------------------------------------------
    def before_pass(self, fb: ForwardBatch) -> None:
        """Every rank, right before a forward pass: fold it into the digest and compare."""
        self.passes += 1
        key = (self.digest, fb.mode == ForwardMode.DECODE, fb.num_tokens, tuple(fb.seq_lens_list),
               tuple(fb.prefix_lens_list), self.free_slots())  # fmt: skip
        if self.passes % self.check_every == 0:
            key += (tuple(fb.input_ids.tolist()),)  # a host sync on CUDA: every check_every passes
        self.digest = hash(key) & DIGEST_MASK  # ints and tuples of ints hash the same in every process
        if self.leader:
            self.channel.publish(PASS, self.digest)
        else:
            self._check(self.channel.receive(), PASS)

    def decide(self, compute: Callable[[], Any]) -> Any:
        """Rank 0 computes a decision and publishes it; the other ranks receive it instead."""
        if self.leader:
            value = compute()
            self.channel.publish(DECIDE, self.digest, pickle.dumps(value))
            return value
        msg = self.channel.receive()
        self._check(msg, DECIDE)
        return pickle.loads(msg.payload)

    def _check(self, msg, kind: int) -> None:
        if msg.kind != kind or msg.digest != self.digest:
            raise TPDivergedError(
                f"tensor-parallel rank {self.channel.tp.rank} diverged from rank 0 after {self.passes} passes: "
                f"rank 0 sent a {KIND_NAMES.get(msg.kind, msg.kind)} message (digest {msg.digest}) where this rank "
                f"expected a {KIND_NAMES[kind]} message (digest {self.digest})"
            )


def attach_replica(sched: Scheduler, continue_hook: Optional[Callable[[Req], bool]]) -> ReplicaSync:
    """Make `sched` one of the replicated schedulers (every rank calls this once); `continue_hook`:
    the program executor's continue hook on rank 0 (None on the other ranks)."""
    check_every = env.tp_check_every(64 if str(sched.device).startswith("cuda") else 1)
    sync = ReplicaSync(StepChannel(sched.runner.tp), lambda: sched.runner.kv_pool.allocator.num_free_slots, check_every,
                       drop_prefix=env.test_tp_diverge_rid_prefix())  # fmt: skip
    sched.replica = sync
    sched.continue_request = replicated_continue(sync, sched, continue_hook)
    sched.runner.pass_hook = sync.before_pass
    return sync


# -- a request graph's continue hook (rank 0 runs the program executor) -----------------------------------
def replicated_continue(sync: ReplicaSync, sched: Scheduler, hook: Optional[Callable[[Req], bool]]):
    """The scheduler's continue hook on every rank: rank 0 runs `hook` and publishes what it did
    to the request (it may cut and replace the last outputs, and start a new segment); the
    other ranks do the same to their copy."""

    def on_rank0(req: Req) -> bool:
        before = list(req.output_ids)
        continued = bool(hook(req)) if hook is not None else False
        if not continued and req.output_ids == before:
            sync.decide(lambda: None)  # nothing to repeat on the other ranks
            return False
        state = (list(req.output_ids), req.segment_start, req.sampling, req.finish_reason, continued)
        return sync.decide(lambda: state)[-1]

    def on_others(req: Req) -> bool:
        state = sync.decide(lambda: None)
        if state is None:
            return False
        output_ids, segment_start, sampling, finish_reason, continued = state
        keep = len(os.path.commonprefix([req.output_ids, output_ids]))
        if keep < len(req.output_ids):
            sched.rewind(req, keep)  # drops the KV of the cut tokens, as rank 0's rewind did
        req.output_ids.extend(output_ids[keep:])
        req.stop_text = None
        if continued:
            req.segment_start, req.sampling, req.finish_reason = segment_start, sampling, finish_reason
            req.grammar = req.output_counts = None
        return continued

    return on_rank0 if sync.leader else on_others

