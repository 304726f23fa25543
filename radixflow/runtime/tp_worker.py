"""The per-step protocol between tensor-parallel ranks.

Rank 0 runs the only scheduler. Before each forward pass it broadcasts the pass
itself: the ForwardBatch's host-side contents plus the req_to_token writes made
through `ReqToTokenPool.write` since the previous pass (admissions, prefix matches,
radix dedupe). The other ranks replay those writes, then place the pass's own slots
(`out_cache_loc`, at positions prefix_len.. of each row, which also covers decode
slots scattered straight into the table), and run the identical pass over their
shard of the model and their own KV pool (same slot indices, their heads). They never
sample: the tokens rank 0 picks (grammar masks and all) reach them as the next pass's
input_ids, so the ranks cannot diverge.

A digest of the batch's table rows travels with the pass (every pass on CPU, every
`RADIXFLOW_TP_CHECK_EVERY` passes on CUDA, where it costs a sync); a rank whose table
differs stops with an error instead of computing attention over the wrong KV.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from radixflow.radix_cache.memory_pool import ReqToTokenPool
from radixflow.runtime.distributed import TPContext, broadcast_obj
from radixflow.runtime.forward_batch import ForwardBatch, ForwardMode

log = logging.getLogger(__name__)


@dataclass
class StepMsg:
    """One forward pass, as rank 0 built it."""

    mode: str
    input_ids: np.ndarray
    positions: np.ndarray
    out_cache_loc: np.ndarray
    req_pool_indices: list
    seq_lens: list
    prefix_lens: list
    extend_lens: list
    logits_indices: np.ndarray
    table_writes: list = field(default_factory=list)  # (row, start, int32 slots)
    digest: Optional[int] = None  # of the batch's req_to_token rows, after this pass's slots


@dataclass
class StopMsg:
    reason: str = "shutdown"


def _host(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.int64).numpy()


class TableDivergedError(RuntimeError):
    pass


def table_digest(table: torch.Tensor, fb: ForwardBatch) -> int:
    """Position-weighted sum of the batch's rows up to their seq_len (cheap, order-aware)."""
    width = max(fb.seq_lens_list)
    rows = table[fb.req_pool_indices, :width].to(torch.int64)
    cols = torch.arange(1, width + 1, device=rows.device)
    valid = cols.unsqueeze(0) <= fb.seq_lens.unsqueeze(1)
    return int((rows * cols * valid).sum())


def step_message(fb: ForwardBatch, writes: list) -> StepMsg:
    return StepMsg(
        mode=fb.mode.value,
        input_ids=_host(fb.input_ids),
        positions=_host(fb.positions),
        out_cache_loc=_host(fb.out_cache_loc),
        req_pool_indices=fb.req_pool_indices.tolist(),
        seq_lens=list(fb.seq_lens_list),
        prefix_lens=list(fb.prefix_lens_list),
        extend_lens=list(fb.extend_lens_list),
        logits_indices=_host(fb.logits_indices),
        table_writes=writes,
    )


def forward_batch_from(msg: StepMsg, device: str) -> ForwardBatch:
    def t(values) -> torch.Tensor:
        return torch.as_tensor(values, dtype=torch.int64).to(device)

    return ForwardBatch(
        mode=ForwardMode(msg.mode),
        input_ids=t(msg.input_ids),
        positions=t(msg.positions),
        out_cache_loc=t(msg.out_cache_loc),
        req_pool_indices=t(msg.req_pool_indices),
        seq_lens=t(msg.seq_lens),
        prefix_lens=t(msg.prefix_lens),
        extend_lens=t(msg.extend_lens),
        logits_indices=t(msg.logits_indices),
        seq_lens_list=list(msg.seq_lens),
        prefix_lens_list=list(msg.prefix_lens),
        extend_lens_list=list(msg.extend_lens),
    )


class RecordingReqToTokenPool(ReqToTokenPool):
    """Rank 0's table: remembers each write until the next pass ships them."""

    def __init__(self, size: int, max_context: int, device: str):
        super().__init__(size, max_context, device)
        self.writes: list = []
        self.passes = 0

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        super().write(row, start, slots)
        if slots.numel():
            self.writes.append((row, start, slots.detach().to("cpu", torch.int32).numpy()))

    def take_writes(self) -> list:
        writes, self.writes = self.writes, []
        return writes


def make_req_to_token(size: int, max_context: int, device: str, tp_size: int, rank: int) -> ReqToTokenPool:
    cls = RecordingReqToTokenPool if tp_size > 1 and rank == 0 else ReqToTokenPool
    return cls(size, max_context, device)


def _check_every(device) -> int:
    default = "64" if str(device).startswith("cuda") else "1"
    return max(int(os.environ.get("RADIXFLOW_TP_CHECK_EVERY", default)), 1)


def broadcast_step(pool: "RecordingReqToTokenPool", fb: ForwardBatch, tp: TPContext) -> None:
    """Rank 0, right before its own forward pass: ship the pass to the other ranks."""
    assert isinstance(pool, RecordingReqToTokenPool)
    msg = step_message(fb, pool.take_writes())
    pool.passes += 1
    if pool.passes % _check_every(pool.table.device) == 0:
        msg.digest = table_digest(pool.table, fb)
    broadcast_obj(msg, tp)


def apply_step(pool: ReqToTokenPool, msg: StepMsg, fb: ForwardBatch) -> None:
    """Bring this rank's req_to_token to rank 0's state for the batch's rows."""
    table = pool.table
    for row, start, slots in msg.table_writes:
        table[row, start : start + len(slots)] = torch.from_numpy(slots).to(table.device)
    cols = torch.cat([torch.arange(p, p + n) for p, n in zip(msg.prefix_lens, msg.extend_lens)])
    rows = torch.repeat_interleave(torch.as_tensor(msg.req_pool_indices), torch.as_tensor(msg.extend_lens))
    table[rows.to(table.device), cols.to(table.device)] = fb.out_cache_loc.to(torch.int32)
    if msg.digest is not None and table_digest(table, fb) != msg.digest:
        raise TableDivergedError("req_to_token differs from rank 0's (a table write was not broadcast)")


def follow_steps(runner) -> str:
    """Ranks > 0: run every pass rank 0 broadcasts until it says stop; returns why."""
    while True:
        msg = broadcast_obj(None, runner.tp)
        if isinstance(msg, StopMsg):
            return msg.reason
        fb = forward_batch_from(msg, runner.device)
        apply_step(runner.req_to_token, msg, fb)
        runner.forward(fb)


def send_stop(tp: TPContext, reason: str = "shutdown") -> None:
    broadcast_obj(StopMsg(reason), tp)
