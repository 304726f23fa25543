"""Tensor-parallel process groups over torch.distributed: one process per rank.

`init_tp` joins the group (TCP rendezvous at `dist_init_addr`): NCCL for tensors on
CUDA, gloo on CPU, plus a gloo group for the per-step messages rank 0 broadcasts.
The NCCL environment the host sets (NCCL_NVLS_ENABLE=0, NCCL_SOCKET_IFNAME, ...) is
read by NCCL itself; nothing here sets or overrides an NCCL variable.

The joined group is this process's runtime context (`get_tp()`); layers keep the
group they were built with, and with tp_size=1 (the trivial group) every collective
below is a no-op.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist

from radixflow.errors import RadixflowError

# rank 0 may idle for hours between requests; the followers wait in a broadcast meanwhile.
# Dead ranks are caught by the heartbeat monitor (tp_launch.py), not by this timeout.
IDLE_TIMEOUT = timedelta(days=30)
JOIN_TIMEOUT = timedelta(seconds=600)  # for every rank to start and check in (model loads come later)


@dataclass
class TPContext:
    rank: int = 0
    size: int = 1
    device_group: Any = None  # tensor collectives: nccl on cuda, gloo on cpu
    cpu_group: Any = None  # host-side agreement (e.g. min KV slots): always gloo
    store_addr: Optional[tuple[str, int]] = None  # the rendezvous TCPStore (heartbeats)
    step_group: Any = None  # gloo: rank 0's messages to the replicated schedulers (step_channel.py)
    one_shot: Any = None  # small all-reduces through symmetric memory (one_shot_allreduce.py), if enabled

    @property
    def is_leader(self) -> bool:
        return self.rank == 0


_TP = TPContext()


def get_tp() -> TPContext:
    return _TP


@contextmanager
def building_with(tp: TPContext) -> Iterator[TPContext]:
    """Layers built inside take `tp` as their group (a tp=1 Engine next to a tp=2 one
    in the same process builds with the trivial group)."""
    global _TP
    saved, _TP = _TP, tp
    try:
        yield tp
    finally:
        _TP = saved


def parse_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise RadixflowError(f"dist_init_addr {addr!r}: expected host:port, e.g. 10.0.0.1:29500")
    return host.strip("[]"), int(port)


def ranks_of_node(tp_size: int, nnodes: int, node_rank: int) -> range:
    if nnodes < 1 or tp_size % nnodes:
        raise RadixflowError(f"tp_size={tp_size} must be a multiple of nnodes={nnodes}")
    if not 0 <= node_rank < nnodes:
        raise RadixflowError(f"node_rank={node_rank} must be in [0, {nnodes})")
    per = tp_size // nnodes
    return range(node_rank * per, (node_rank + 1) * per)


def init_tp(
    tp_size: int,
    rank: int,
    dist_init_addr: str,
    device: str,
    local_rank: int = 0,
    check_peers: Optional[Callable[[], Optional[str]]] = None,
) -> TPContext:
    """Join the tensor-parallel group as `rank`. Rank 0 hosts the TCPStore and waits
    until every rank has checked in, calling `check_peers` meanwhile (it returns why a
    spawned rank died, which fails the start instead of hanging it)."""
    global _TP
    host, port = parse_addr(dist_init_addr)
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(local_rank)
    store = dist.TCPStore(host, port, is_master=rank == 0, timeout=JOIN_TIMEOUT, wait_for_workers=False)
    store.set(f"radixflow/joined/{rank}", "1")
    if rank == 0:
        _wait_for_ranks(store, tp_size, check_peers)
    kw = {"timeout": IDLE_TIMEOUT} if backend == "gloo" else {}
    dist.init_process_group(backend, store=store, rank=rank, world_size=tp_size, **kw)
    world = dist.group.WORLD
    if backend == "nccl":
        # NCCL builds its communicator on the first collective; that must not be inside a
        # CUDA-graph capture (it hangs there), so run one now.
        dist.all_reduce(torch.zeros(1, device="cuda"), group=world)
        torch.cuda.synchronize()
    cpu = world if backend == "gloo" else dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    steps = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)  # its own: queued broadcasts never mix with others
    _TP = TPContext(rank, tp_size, world, cpu, (host, port), steps)
    return _TP


def _wait_for_ranks(store, tp_size: int, check_peers: Optional[Callable[[], Optional[str]]]) -> None:
    deadline = time.monotonic() + JOIN_TIMEOUT.total_seconds()
    missing = list(range(1, tp_size))
    while missing:
        missing = [r for r in missing if not store.check([f"radixflow/joined/{r}"])]
        dead = check_peers() if check_peers else None
        if dead:
            raise RadixflowError(f"tensor-parallel start failed: {dead}")
        if missing and time.monotonic() > deadline:
            raise RadixflowError(
                f"tensor-parallel ranks {missing} did not join within {JOIN_TIMEOUT.total_seconds():.0f}s; "
                "start every node with the same --tp-size, --nnodes and --dist-init-addr"
            )
        if missing:
            time.sleep(0.1)


def destroy_tp(timeout_s: float = 10.0) -> None:
    """Tear the group down; if that blocks (NCCL can wait on work a CUDA graph captured),
    abort it after `timeout_s` instead of hanging the shutdown."""
    global _TP
    if _TP.size > 1 and dist.is_initialized():
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        done = threading.Thread(target=dist.destroy_process_group, daemon=True)
        done.start()
        done.join(timeout_s)
        if done.is_alive():
            abort_tp()
    _TP = TPContext()


def abort_tp() -> None:
    """Unblock collectives stuck on a dead peer (best effort)."""
    try:
        dist.distributed_c10d._abort_process_group()
    except Exception:  # noqa: BLE001 - already torn down, or not supported by this backend
        pass


# -- collectives (on the group a layer or runner was built with) ------------------------------------
def all_reduce(x: torch.Tensor, tp: TPContext) -> torch.Tensor:
    """The sum over ranks; `x` itself (summed in place) or, through the one-shot path, a new tensor."""
    if tp.one_shot is not None and tp.one_shot.fits(x):
        return tp.one_shot(x)
    if tp.size > 1:
        dist.all_reduce(x, group=tp.device_group)
    return x


def all_gather_last_dim(x: torch.Tensor, tp: TPContext) -> torch.Tensor:
    """Concatenate every rank's `x` along the last dimension (same shape on every rank)."""
    if tp.size == 1:
        return x
    x = x.contiguous()
    if x.is_cuda:
        out = torch.empty((tp.size, *x.shape), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, x, group=tp.device_group)
        return torch.cat(out.unbind(0), dim=-1)
    parts = [torch.empty_like(x) for _ in range(tp.size)]
    dist.all_gather(parts, x, group=tp.device_group)
    return torch.cat(parts, dim=-1)


def min_over_ranks(value: int, tp: TPContext) -> int:
    """The smallest `value` any rank holds (e.g. KV slots that fit on every GPU)."""
    if tp.size == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=tp.cpu_group)
    return int(t.item())
