"""Start, watch and stop the tensor-parallel ranks.

Node 0 hosts rank 0: the Engine's own process, or the server's scheduler process. It
spawns this node's other ranks (torch.multiprocessing, spawn) and joins the group.
A node with node_rank > 0 (`radixflow serve --nnodes N --node-rank K ...`) only runs
its ranks (`run_worker_node`); it serves no HTTP.

Health: every rank > 0 bumps a heartbeat counter in the rendezvous TCPStore; rank 0
watches the counters and its spawned processes. A dead rank is reported with the
reason within seconds (`on_failure`), and the group is aborted so that nothing hangs
in a collective. Ranks > 0 exit when rank 0 (or their parent launcher) goes away.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable, Optional

import torch.distributed as dist
import torch.multiprocessing as mp

from radixflow.errors import RadixflowError
from radixflow.runtime.distributed.tp_group import TPContext, abort_tp, destroy_tp, init_tp, ranks_of_node
from radixflow.runtime.child_processes import exit_text, free_port, stop_processes
from radixflow.runtime.gc_freeze import freeze_startup_objects
from radixflow.runtime.server_args import ServerArgs

log = logging.getLogger("radixflow.tp")

HEARTBEAT_S = 0.5
DEAD_AFTER_S = 10.0  # a rank whose heartbeat has not moved for this long is dead
JOIN_S = 10.0


class TPRankFailed(RadixflowError):
    """A tensor-parallel rank died; the group cannot run any more passes."""


def check_tp_args(args: ServerArgs) -> None:
    if args.tp_size < 1:
        raise RadixflowError("tp_size must be >= 1")
    ranks_of_node(args.tp_size, args.nnodes, args.node_rank)
    if args.enable_one_shot_allreduce and (args.tp_size == 1 or args.nnodes > 1 or args.resolved_device() != "cuda"):
        raise RadixflowError("--enable-one-shot-allreduce needs tensor parallelism (--tp-size > 1) on the CUDA GPUs "
                             "of one host (--nnodes 1)")
    if args.nnodes > 1 and not args.dist_init_addr:
        raise RadixflowError("--nnodes > 1 needs --dist-init-addr host:port (node 0's address), the same on every node")


# -- rank 0 --------------------------------------------------------------------------------------
@dataclass
class TPGroup:
    """Rank 0's handle on the other ranks."""

    args: ServerArgs
    procs: dict = field(default_factory=dict)  # rank -> process spawned on this node
    tp: Optional[TPContext] = None  # this process's group, once joined
    failure: Optional[str] = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def check(self) -> None:
        if self.failure:
            raise TPRankFailed(self.failure)

    def wait_failure(self, timeout: float) -> Optional[str]:
        deadline = time.monotonic() + timeout
        while self.failure is None and time.monotonic() < deadline and not self._stop.is_set():
            time.sleep(0.05)
        return self.failure

    def kill(self) -> None:
        """After a failed start: abort the group and end this node's ranks now."""
        self._stop.set()
        abort_tp()
        for p in self.procs.values():
            p.kill()
        stop_processes(self.procs, JOIN_S)
        destroy_tp()

    def shutdown(self) -> None:
        """Tell the ranks to stop (if they still can listen), then reap this node's."""
        from radixflow.runtime.distributed.step_channel import send_stop as stop_replicas
        from radixflow.runtime.distributed.tp_worker import send_stop

        self._stop.set()
        if self.failure is None and self.tp is not None:
            try:
                (stop_replicas if self.args.tp_scheduler == "replicated" else send_stop)(self.tp)
            except Exception:  # noqa: BLE001 - a rank died meanwhile
                pass
        destroy_tp()
        stop_processes(self.procs, JOIN_S)


def start_tp(args: ServerArgs, on_failure: Optional[Callable[[str], None]] = None) -> Optional[TPGroup]:
    """On node 0 with tp_size > 1: spawn this node's ranks 1.., join the group as rank 0
    and start the monitor. Returns None for tp_size=1."""
    check_tp_args(args)
    if args.tp_size == 1:
        return None
    assert args.node_rank == 0, "ranks of nodes > 0 start through run_worker_node"
    if not args.dist_init_addr:
        args.dist_init_addr = f"127.0.0.1:{free_port()}"
    group = TPGroup(args)
    group.procs = _spawn_ranks(args, ranks_of_node(args.tp_size, args.nnodes, 0)[1:])
    try:
        group.tp = init_tp(args.tp_size, 0, args.dist_init_addr, args.resolved_device(), 0, lambda: _dead_child(group.procs))
    except BaseException:
        stop_processes(group.procs, JOIN_S)
        raise
    threading.Thread(target=_monitor, args=(group, on_failure), name="radixflow-tp-monitor", daemon=True).start()
    return group


def _spawn_ranks(args: ServerArgs, ranks) -> dict:
    ctx = mp.get_context("spawn")
    procs = {}
    for rank in ranks:
        p = ctx.Process(target=worker_main, args=(args, rank, os.getpid()), name=f"radixflow-tp{rank}", daemon=True)
        p.start()
        procs[rank] = p
    return procs


def _monitor(group: TPGroup, on_failure: Optional[Callable[[str], None]]) -> None:
    host, port = group.tp.store_addr
    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=10))
    last = {r: (-1, time.monotonic()) for r in range(1, group.args.tp_size)}
    while not group._stop.wait(HEARTBEAT_S):
        try:
            reason = _dead_rank(group, store, last)
        except Exception as e:  # noqa: BLE001 - the store went away with a shutdown
            reason = None if group._stop.is_set() else f"tensor-parallel heartbeat store failed: {e}"
        if reason and not group._stop.is_set():
            group.failure = reason
            log.error(reason)
            print(f"radixflow: {reason}", file=sys.stderr, flush=True)
            abort_tp()
            if on_failure is not None:
                on_failure(reason)
            return


def _dead_child(procs: dict) -> Optional[str]:
    for rank, proc in procs.items():
        if not proc.is_alive():
            return f"tensor-parallel rank {rank} died ({exit_text(proc.exitcode)})"
    return None


def _dead_rank(group: TPGroup, store, last: dict) -> Optional[str]:
    for rank in last:
        if store.check([f"radixflow/failure/{rank}"]):
            return f"tensor-parallel rank {rank} failed: {store.get(f'radixflow/failure/{rank}').decode()}"
    dead = _dead_child(group.procs)
    if dead:
        return dead
    now = time.monotonic()
    for rank, (count, since) in last.items():
        beat = store.add(f"radixflow/hb/{rank}", 0)
        if beat != count:
            last[rank] = (beat, now)
        elif now - since > DEAD_AFTER_S:
            return f"tensor-parallel rank {rank} stopped responding (no heartbeat for {now - since:.0f}s)"
    return None


# -- ranks > 0 ---------------------------------------------------------------------------------------
def worker_main(args: ServerArgs, rank: int, parent_pid: int) -> None:
    """Process entry of one rank > 0: join, load the model shard, then follow rank 0: run the same
    scheduler over its inputs (--tp-scheduler replicated) or run the passes it broadcasts (leader)."""

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0 / the launcher shuts us down
    logging.basicConfig(level=args.log_level.upper(), format=f"[%(asctime)s tp{rank}] %(message)s")
    per_node = args.tp_size // args.nnodes
    tp = init_tp(args.tp_size, rank, args.dist_init_addr, args.resolved_device(), rank % per_node)
    stopping = threading.Event()
    threading.Thread(target=_heartbeat, args=(rank, parent_pid, tp.store_addr, stopping), daemon=True).start()
    try:
        reason = _follow(dataclasses.replace(args))
    except Exception as e:  # rank 0 went away mid-collective, or this rank failed (diverged)
        log.error("tensor-parallel rank %d failed: %s: %s", rank, type(e).__name__, e)
        _report_failure(tp, rank, f"{type(e).__name__}: {e}")
        os._exit(1)
    stopping.set()
    log.info("tensor-parallel rank %d stopping (%s)", rank, reason)
    destroy_tp()


def _follow(args: ServerArgs) -> str:
    if args.tp_scheduler == "replicated":
        from radixflow.runtime.replica_follower import follow_leader

        return follow_leader(args)
    from radixflow.runtime.execution.model_runner import ModelRunner
    from radixflow.runtime.distributed.tp_worker import follow_steps

    runner = ModelRunner(args)
    freeze_startup_objects(not args.disable_gc_freeze)  # a full collection on one rank would stall every rank's collective
    try:
        return follow_steps(runner)
    finally:
        runner.release_cuda_graphs()


def _report_failure(tp: TPContext, rank: int, reason: str) -> None:
    """Leave why this rank fails in the rendezvous store, for rank 0's monitor to report."""
    try:
        host, port = tp.store_addr
        store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=5))
        store.set(f"radixflow/failure/{rank}", reason[:2000])
    except Exception:  # noqa: BLE001 - rank 0 is gone too: nobody to tell
        pass


def _heartbeat(rank: int, parent_pid: int, store_addr: tuple, stopping: threading.Event) -> None:
    host, port = store_addr
    try:
        store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=10))
        while os.getppid() == parent_pid:
            store.add(f"radixflow/hb/{rank}", 1)
            time.sleep(HEARTBEAT_S)
        reason = "its parent process is gone"
    except Exception as e:  # noqa: BLE001 - rank 0 (the store's host) is gone
        reason = f"rank 0 is unreachable ({type(e).__name__})"
        if stopping.wait(2.0):  # rank 0 closed the store after telling us to stop
            return
    print(f"radixflow: tensor-parallel rank {rank} exiting: {reason}", file=sys.stderr, flush=True)
    os._exit(1)


def run_worker_node(args: ServerArgs) -> int:
    """`radixflow serve --node-rank K` (K > 0): run this node's ranks until rank 0 stops them."""
    check_tp_args(args)
    ranks = ranks_of_node(args.tp_size, args.nnodes, args.node_rank)
    print(f"radixflow: node {args.node_rank} running tensor-parallel ranks {list(ranks)}", flush=True)
    procs = _spawn_ranks(args, ranks)
    while all(p.is_alive() for p in procs.values()):
        time.sleep(HEARTBEAT_S)
    bad = {r: p.exitcode for r, p in procs.items() if p.exitcode not in (None, 0)}
    for p in procs.values():
        p.join(JOIN_S)
        if p.is_alive():
            p.kill()
    if bad:
        print(f"radixflow: ranks {', '.join(f'{r} ({exit_text(c)})' for r, c in bad.items())} failed", file=sys.stderr)
        return 1
    return 0
