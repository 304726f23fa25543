"""The per-step protocol between tensor-parallel ranks.

Rank 0 runs the only scheduler. Before each forward pass it broadcasts the pass
itself: the ForwardBatch's tensors plus the req_to_token writes made through
`ReqToTokenPool.write` since the previous pass (admissions, prefix matches, radix
dedupe). The other ranks replay those writes, then place the pass's own slots
(`out_cache_loc`, at positions prefix_len.. of each row, which also covers decode
slots scattered straight into the table), and run the identical pass over their
shard of the model and their own KV pool (same slot indices, their heads). They never
sample: the tokens rank 0 picks (grammar masks and all) reach them as the next pass's
input_ids, so the ranks cannot diverge.

A pass travels in three int64 tensors. Its shape goes on the host group (gloo): a fixed
header (kind and section sizes), then the host lists (lengths, table-write positions).
Its device tensors (ids, positions, slots, ...) go as one packed payload on the device
group (NCCL on GPUs, gloo on CPU). Neither end waits for its GPU: rank 0 sends pass n + 1
while its GPU runs pass n, and the other ranks learn pass n + 1 from the host group and
queue it behind pass n, as rank 0 does. (With the header on the device group, a
follower had to wait for its GPU to finish pass n before it could read the header, then
left its GPU idle while it launched pass n + 1: every rank paid that gap in the next
all-reduce.)

A digest of the batch's table rows travels with the pass (every pass on CPU, every
`RADIXFLOW_TP_CHECK_EVERY` passes on CUDA, where it costs a sync); a rank whose table
differs stops with an error instead of computing attention over the wrong KV.
"""

from __future__ import annotations

import logging

import torch

from radixflow import env
from radixflow.host_copy import to_device_async
from radixflow.radix_cache.memory_pool import ReqToTokenPool
from radixflow.runtime.distributed.tp_group import TPContext
from radixflow.runtime.execution.forward_batch import ForwardBatch, ForwardMode

log = logging.getLogger(__name__)

STOP, EXTEND, DECODE = 0, 1, 2
KIND = {ForwardMode.EXTEND: EXTEND, ForwardMode.DECODE: DECODE}
# header: kind, tokens, batch, logits rows, table writes, written slots, has digest, digest
HEADER_LEN = 8


class TableDivergedError(RuntimeError):
    pass


def table_digest(table: torch.Tensor, fb: ForwardBatch) -> int:
    """Position-weighted sum of the batch's rows up to their seq_len (cheap, order-aware)."""
    width = max(fb.seq_lens_list)
    rows = table[fb.req_pool_indices, :width].to(torch.int64)
    cols = torch.arange(1, width + 1, device=rows.device)
    valid = cols.unsqueeze(0) <= fb.seq_lens.unsqueeze(1)
    return int((rows * cols * valid).sum())


class RecordingReqToTokenPool(ReqToTokenPool):
    """Rank 0's table: remembers each write (on the device, no sync) until the next pass ships them."""

    def __init__(self, size: int, max_context: int, device: str):
        super().__init__(size, max_context, device)
        self.writes: list = []  # (row, start, int64 slots on the table's device)
        self.passes = 0
        self.check_every = env.tp_check_every(64 if str(device).startswith("cuda") else 1)  # passes per digest

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        super().write(row, start, slots)
        if slots.numel():
            self.writes.append((row, start, to_device_async(slots.detach().to(torch.int64), self.table.device)))

    def take_writes(self) -> list:
        writes, self.writes = self.writes, []
        return writes


def make_req_to_token(size: int, max_context: int, device: str, rank: int, leader_broadcasts: bool) -> ReqToTokenPool:
    cls = RecordingReqToTokenPool if leader_broadcasts and rank == 0 else ReqToTokenPool
    return cls(size, max_context, device)


def _broadcast(t: torch.Tensor, tp: TPContext) -> torch.Tensor:
    torch.distributed.broadcast(t, src=0, group=tp.device_group if t.device.type == "cuda" else tp.cpu_group)
    return t


# -- rank 0 ---------------------------------------------------------------------------------------
def broadcast_step(pool: "RecordingReqToTokenPool", fb: ForwardBatch, tp: TPContext) -> None:
    """Rank 0, right before its own forward pass: ship the pass to the other ranks."""
    assert isinstance(pool, RecordingReqToTokenPool)
    writes = pool.take_writes()
    pool.passes += 1
    digest = table_digest(pool.table, fb) if pool.passes % pool.check_every == 0 else None
    meta = [w[0] for w in writes] + [w[1] for w in writes] + [w[2].numel() for w in writes]
    lens = fb.seq_lens_list + fb.prefix_lens_list + fb.extend_lens_list
    payload = torch.cat(
        [fb.input_ids, fb.positions, fb.out_cache_loc, fb.req_pool_indices, fb.logits_indices] + [w[2] for w in writes]
    ).to(torch.int64)
    header = [KIND[fb.mode], fb.num_tokens, fb.batch_size, fb.logits_indices.numel(), len(writes),
              sum(w[2].numel() for w in writes), digest is not None, digest or 0]  # fmt: skip
    _broadcast(torch.tensor(header, dtype=torch.int64), tp)  # host group
    _broadcast(torch.tensor(lens + meta, dtype=torch.int64), tp)
    _broadcast(payload, tp)  # device group on GPUs


def send_stop(tp: TPContext) -> None:
    _broadcast(torch.tensor([STOP] + [0] * (HEADER_LEN - 1), dtype=torch.int64), tp)


# -- ranks > 0 ------------------------------------------------------------------------------------
def _split(payload: torch.Tensor, sizes: list) -> list:
    return list(torch.split(payload, sizes))


def receive_step(pool: ReqToTokenPool, tp: TPContext) -> "ForwardBatch | None":
    """Ranks > 0: the next pass (its table writes applied), or None when rank 0 says stop."""
    device = pool.table.device
    header = _broadcast(torch.empty(HEADER_LEN, dtype=torch.int64), tp).tolist()
    kind, t, b, n, nw, nslots, has_digest, digest = header
    if kind == STOP:
        return None
    host = _broadcast(torch.empty(3 * b + 3 * nw, dtype=torch.int64), tp)
    sizes = [t, t, t, b, n, nslots]
    payload = _broadcast(torch.empty(sum(sizes), dtype=torch.int64, device=device), tp)
    ids, pos, loc, rows, logits_idx, slots = _split(payload, sizes)
    lens = to_device_async(host[: 3 * b], device)  # seq, prefix, extend
    host = host.tolist()
    seq, pre, ext = host[:b], host[b : 2 * b], host[2 * b : 3 * b]
    w_rows, w_starts, w_lens = host[3 * b : 3 * b + nw], host[3 * b + nw : 3 * b + 2 * nw], host[3 * b + 2 * nw :]
    fb = ForwardBatch(
        mode=ForwardMode.EXTEND if kind == EXTEND else ForwardMode.DECODE,
        input_ids=ids, positions=pos, out_cache_loc=loc, req_pool_indices=rows, logits_indices=logits_idx,
        seq_lens=lens[:b], prefix_lens=lens[b : 2 * b], extend_lens=lens[2 * b :],
        seq_lens_list=seq, prefix_lens_list=pre, extend_lens_list=ext,
    )  # fmt: skip
    _scatter_rows(pool.table, w_rows, w_starts, w_lens, slots)
    _scatter_rows(pool.table, rows, fb.prefix_lens, fb.extend_lens, loc)
    if has_digest and table_digest(pool.table, fb) != digest:
        raise TableDivergedError("req_to_token differs from rank 0's (a table write was not broadcast)")
    return fb


def _scatter_rows(table: torch.Tensor, rows, starts, lens, slots: torch.Tensor) -> None:
    """table[rows[i], starts[i] : starts[i] + lens[i]] = the i-th run of `slots`, in one indexed write.
    rows, starts and lens are host lists (copied without a sync) or tensors on the table's device."""
    if slots.numel() == 0:
        return
    device = table.device
    rows, starts, lens = (x if torch.is_tensor(x) else to_device_async(torch.tensor(x, dtype=torch.int64), device)
                          for x in (rows, starts, lens))
    total = slots.numel()
    row_idx = torch.repeat_interleave(rows, lens, output_size=total)
    offset = torch.arange(total, device=device) - torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens, output_size=total)
    col_idx = torch.repeat_interleave(starts, lens, output_size=total) + offset
    table[row_idx, col_idx] = slots.to(torch.int32)


def follow_steps(runner) -> str:
    """Ranks > 0: run every pass rank 0 broadcasts until it says stop; returns why."""
    while True:
        fb = receive_step(runner.req_to_token, runner.tp)
        if fb is None:
            return "shutdown"
        runner.forward(fb)
