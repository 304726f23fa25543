"""The scheduler in its own process: receives requests and aborts over ZMQ without
blocking the batch loop, runs `Scheduler.step()`, and pushes outputs to the detokenizer.

A failure while adding or running requests fails those requests (their outputs carry
`error`, which the HTTP layer turns into a 500) and the loop goes on.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import traceback
from typing import Any, Optional

import zmq

from radixflow import env
from radixflow.errors import RadixflowError
from radixflow.runtime.gc_freeze import freeze_startup_objects
from radixflow.runtime.output_delta import Sent, as_delta
from radixflow.runtime.scheduling.req import Req, ReqOutput, ReqState
from radixflow.runtime.server.step_profiler import StepProfiler
from radixflow.runtime.server_args import ServerArgs
from radixflow.runtime.server.server_messages import (
    AbortReq,
    ControlReply,
    ControlReq,
    DecodeParams,
    IpcNames,
    ModelInfo,
    NewRequests,
    OutputBatch,
    StatsSnapshot,
    TokenizedBatch,
)

log = logging.getLogger("radixflow.scheduler")

IDLE_POLL_MS = 200
STATS_PERIOD_S = 1.0


def run_scheduler_process(args: ServerArgs, ipc: IpcNames, ready_conn, parent_pid: int) -> None:
    """Process entry point: load the model, report ready (or the error), then serve."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent shuts us down
    logging.basicConfig(level=args.log_level.upper(), format="[%(asctime)s scheduler] %(message)s")
    try:
        loop = SchedulerLoop(args, ipc, parent_pid)
    except Exception as e:  # report why start-up failed, then exit
        # the arguments' or the model's fault (RadixflowError) says what to change in its message: no traceback
        trace = "" if isinstance(e, RadixflowError) else f"\n{traceback.format_exc()}"
        ready_conn.send(("error", f"{type(e).__name__}: {e}{trace}"))
        return
    ready_conn.send(("ok", loop.model_info()))
    ready_conn.close()
    freeze_startup_objects(not args.disable_gc_freeze)
    loop.run()


class SchedulerLoop:
    def __init__(self, args: ServerArgs, ipc: IpcNames, parent_pid: int):
        from radixflow.runtime.build import build_runtime
        from radixflow.runtime.server.program_service import SchedulerPrograms  # request graphs: POST /program

        self.args = args
        self.parent_pid = parent_pid
        rt = build_runtime(args, emit_outputs=True, on_tp_failure=_exit_on_rank_failure)
        self.tp, self.runner, self.scheduler = rt.tp, rt.runner, rt.scheduler
        self.tokenizer_path, self.eos_ids = rt.tokenizer_path, rt.eos_ids
        self.programs = SchedulerPrograms(rt.programs, self.send)
        self.profiler = StepProfiler()  # POST /start_profile, /stop_profile
        self.inflight: dict[str, Req] = {}
        self.streaming: dict[str, Sent] = {}  # rid -> what its last report carried
        ctx = zmq.Context()
        self.recv_sock = ctx.socket(zmq.PULL)
        self.recv_sock.bind(ipc.scheduler)
        self.send_sock = ctx.socket(zmq.PUSH)
        self.send_sock.connect(ipc.detokenizer)
        self.poller = zmq.Poller()
        self.poller.register(self.recv_sock, zmq.POLLIN)
        self.last_stats = 0.0
        self.last_log = time.time()
        self.decode_tokens_at_log = 0
        self._install_fault_injection()

    def model_info(self) -> ModelInfo:
        r = self.runner
        return ModelInfo(
            model_path=self.args.model_path,
            model_dir=r.model_dir,
            tokenizer_path=self.tokenizer_path,
            architectures=list(getattr(r.config, "architectures", None) or ["LlamaForCausalLM"]),
            vocab_size=r.vocab_size,
            context_len=r.context_len,
            max_total_num_tokens=r.kv_pool.allocator.capacity_slots,
            eos_ids=set(self.eos_ids),
        )

    # -- main loop ----------------------------------------------------------------------------
    def run(self) -> None:
        while True:
            self._recv_all(block=not self.scheduler.has_work())
            if self.scheduler.has_work():
                self._step()
            self._periodic()

    def _recv_all(self, block: bool) -> None:
        if block and not self.poller.poll(IDLE_POLL_MS):
            return
        while True:
            try:
                msg = self.recv_sock.recv_pyobj(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._handle(msg)

    def _handle(self, msg) -> None:
        if isinstance(msg, TokenizedBatch):
            self._add(msg)
        elif isinstance(msg, AbortReq):
            self._abort(msg)
        elif isinstance(msg, ControlReq) and msg.kind == "program":
            self.programs.handle(msg)
        elif isinstance(msg, ControlReq):
            self.send(ControlReply(msg.req_id, self._control(msg.kind, msg.args)))
        else:
            raise AssertionError(f"unexpected message {type(msg).__name__}")

    # -- requests in ------------------------------------------------------------------------------
    def _add(self, batch: TokenizedBatch) -> None:
        self.send(NewRequests({r.rid: _decode_params(r) for r in batch.reqs}))
        failed = []
        for req in batch.reqs:
            self.inflight[req.rid] = req
            if batch.stream:
                self.streaming[req.rid] = Sent()
            try:
                self.scheduler.add_request(req)
            except Exception as e:
                log.exception("adding request %s failed", req.rid)
                failed.append(self._fail(req, e))
        if failed:
            self._emit(failed)

    def _abort(self, msg: AbortReq) -> None:
        rids = list(self.inflight) if msg.abort_all else [msg.rid]
        outs = []
        for rid in rids:
            req = self.scheduler.abort(rid)
            if req is not None:
                outs.append(req.to_output())
        self._emit(outs)
        self.programs.abort(None if msg.abort_all else msg.rid)

    def _control(self, kind: str, args: Any = None):
        if kind == "flush_cache":
            return self.scheduler.flush_cache()
        if kind == "server_info":
            return self.server_info()
        if kind == "start_profile":
            return self.profiler.start(args)
        if kind == "stop_profile":
            return self.profiler.stop()
        return None

    def server_info(self) -> dict:
        s = self.scheduler
        alloc = self.runner.kv_pool.allocator
        used = alloc.capacity_slots - alloc.num_free_slots
        cached = s.tree.total_size
        return {
            "max_total_num_tokens": alloc.capacity_slots,
            "max_running_requests": s.args.max_running_requests,  # as resolved for the device (the flag may be unset)
            "free_slots": alloc.num_free_slots,
            "used_slots": used,
            "cached_slots": cached,
            "request_slots": used - cached,  # held privately by running requests
            "locked_cached_slots": s.tree.protected_size,
            "num_running_reqs": s.num_running,
            "num_waiting_reqs": len(s.waiting),
            "num_inflight_reqs": len(self.inflight),
            "num_running_programs": len(self.programs.executor.runs),
            "token_usage": s.token_usage(),
            "cache_hit_rate": s.stats.cache_hit_rate,
            "num_retractions": s.stats.retractions,
            "grammar_rows_switched": s.stats.grammar_rows_switched,
            "scheduler_pid": os.getpid(),
        }

    # -- one step ------------------------------------------------------------------------------------
    def _step(self) -> None:
        try:
            outs = self.scheduler.step()
            self.programs.on_step()
            self.profiler.on_step()
        except Exception as e:
            log.exception("a forward step failed; failing the requests in it")
            outs = self._fail_batch(e)
        self._emit(outs)

    def _fail_batch(self, err: Exception) -> list[ReqOutput]:
        """Fail every request that may have been in the failed step (all admitted ones;
        those that finished before the error get their normal output); waiting requests
        stay queued. Frees their KV, and any slots the broken pass left unowned."""
        waiting = {id(r) for r in self.scheduler.waiting + self.scheduler.pending_grammar}
        admitted = [r for r in self.inflight.values() if id(r) not in waiting]
        outs = [r.to_output() if r.finished else self._fail(r, err) for r in admitted]
        lost = self.scheduler.reclaim_unowned_pages()
        if lost:
            log.warning("reclaimed %d KV pages left by the failed step", lost)
        return outs

    def _fail(self, req: Req, err: Exception) -> ReqOutput:
        msg = f"internal error while serving this request: {type(err).__name__}: {err}"
        req.finish({"type": "abort", "message": msg, "status_code": 500})
        if self.scheduler.abort(req.rid) is None:  # not in any queue: free what it holds (a retired one holds nothing)
            self.scheduler.kv.release(req, cache=False)
        req.state = ReqState.FINISHED
        out = req.to_output()
        out.error = msg
        return out

    def _emit(self, outs: list[ReqOutput]) -> None:
        keep = []
        interval = max(self.args.stream_interval, 1)
        for o in outs:
            sent = self.streaming.get(o.rid)
            if o.finished:
                self.inflight.pop(o.rid, None)
                self.streaming.pop(o.rid, None)
                keep.append(o if sent is None else as_delta(o, sent))
            elif sent is not None and len(o.output_ids) - sent.lengths[0] >= interval:
                keep.append(as_delta(o, sent))
        if keep:
            self.send(OutputBatch(keep, self._stats_if_due()))

    def send(self, msg) -> None:
        self.send_sock.send_pyobj(msg)

    # -- stats, logging, liveness ------------------------------------------------------------------
    def _stats_if_due(self, force: bool = False) -> Optional[StatsSnapshot]:
        now = time.time()
        if not force and now - self.last_stats < STATS_PERIOD_S:
            return None
        self.last_stats = now
        info = self.server_info()
        return StatsSnapshot(
            num_running=info["num_running_reqs"],
            num_waiting=info["num_waiting_reqs"],
            token_usage=info["token_usage"],
            cache_hit_rate=info["cache_hit_rate"],
            gen_throughput=self._throughput(now),
            max_total_num_tokens=info["max_total_num_tokens"],
            free_slots=info["free_slots"],
            cached_slots=info["cached_slots"],
            grammar_rows_switched=info["grammar_rows_switched"],
        )

    def _throughput(self, now: float) -> float:
        span = max(now - self.last_log, 1e-6)
        return (self.scheduler.stats.decode_tokens - self.decode_tokens_at_log) / span

    def _periodic(self) -> None:
        now = time.time()
        if now - self.last_stats >= STATS_PERIOD_S:
            self.send(self._stats_if_due(force=True))
        if now - self.last_log >= self.args.log_interval_s:
            if self.scheduler.has_work() or self.scheduler.stats.decode_tokens != self.decode_tokens_at_log:
                self._log_line(now)
            self.last_log = now
            self.decode_tokens_at_log = self.scheduler.stats.decode_tokens
        if os.getppid() != self.parent_pid:
            log.error("the server process is gone; scheduler exiting")
            os._exit(1)

    def _log_line(self, now: float) -> None:
        s = self.scheduler
        log.info(
            "#running-req: %d, #queue-req: %d, token usage: %.2f, cache hit rate: %.2f, gen throughput (token/s): %.2f",
            s.num_running,
            len(s.waiting),
            s.token_usage(),
            s.stats.cache_hit_rate,
            self._throughput(now),
        )

    def _install_fault_injection(self) -> None:
        prefix = env.test_fault_rid_prefix()
        if not prefix:
            return
        forward = self.runner.forward

        def faulty(fb):
            rows = set(fb.req_pool_indices.tolist())
            if any(r.rid.startswith(prefix) and r.req_pool_idx in rows for r in self.inflight.values()):
                raise RuntimeError("injected fault (test)")
            return forward(fb)

        self.runner.forward = faulty


def _exit_on_rank_failure(reason: str) -> None:
    """A tensor-parallel rank died: no pass can run any more; the server reports it and exits."""
    log.error("%s; the scheduler exits", reason)
    os._exit(1)


def _decode_params(req: Req) -> DecodeParams:
    sp = req.sampling
    return DecodeParams(sp.skip_special_tokens, sp.cut_strs, sp.no_stop_trim)
