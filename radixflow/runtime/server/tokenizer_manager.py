"""The main process's side of the pipeline (asyncio): validates and tokenizes generate
calls, sends them to the scheduler, and hands each caller the outputs that the
detokenizer sends back. Leaving a generate iterator early (client gone) aborts what
is still running, which frees its KV in the scheduler at once."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional

import zmq
import zmq.asyncio

from radixflow.errors import RadixflowError
from radixflow.runtime.generate_request import GenerateInput, RequestBuilder, build_result
from radixflow.runtime.scheduling.logprobs import LogprobCollector
from radixflow.runtime.server import request_log
from radixflow.runtime.server.metrics import ServerMetrics
from radixflow.runtime.output_delta import Assembly
from radixflow.runtime.scheduling.req import ReqOutput
from radixflow.runtime.server_args import ServerArgs
from radixflow.runtime.token_bytes import TokenBytes
from radixflow.runtime.server.server_messages import (
    AbortReq,
    ControlReply,
    ControlReq,
    DetokBatch,
    IpcNames,
    ModelInfo,
    ProgramDelta,
    StatsSnapshot,
    TokenizedBatch,
)

log = logging.getLogger("radixflow.tokenizer_manager")
ABANDONED_KEEP_S = 30.0  # a request whose client left holds its rid until its last report, or this long at most


@dataclass
class Pending:
    """One request in flight, as the main process tracks it."""

    rid: str
    index: int
    queue: asyncio.Queue
    created: float
    logprob: Any
    last_time: float = 0.0
    last_len: int = 0
    done: bool = False
    req: Any = None  # the request as sent, kept for --log-requests
    assembly: Assembly = field(default_factory=Assembly)  # its whole lists, from its reports (deltas when streamed)
    abandoned: float = 0.0  # when its caller left before it finished: kept (its rid in use) until its last report
    last_report: bool = False  # the scheduler's last report for it arrived (one failed on an error may still send)


@dataclass
class Event:
    """An update for one request of a generate call: its index in the call and result."""

    index: int
    result: dict
    finished: bool
    error: Optional[str] = None
    status_code: int = 200


class ServerDeadError(RuntimeError):
    pass


@dataclass
class TokenizerManager:
    args: ServerArgs
    info: ModelInfo
    ipc: IpcNames
    tokenizer: Any = None
    pending: dict = field(default_factory=dict)
    controls: dict = field(default_factory=dict)
    program_streams: dict = field(default_factory=dict)  # req_id -> asyncio.Queue of ProgramDelta, then the ControlReply
    # a call's own rid -> its requests' rids, where they differ (n > 1: rid-j; a batch: rid_i): /abort_request
    # with the rid the client sent stops them all
    groups: dict = field(default_factory=dict)
    abandoned: dict = field(default_factory=dict)  # rid -> its Pending, for requests whose caller left; oldest first
    stats: StatsSnapshot = field(default_factory=StatsSnapshot)
    dead_reason: Optional[str] = None
    child_pids: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        from radixflow.model_files import generation_defaults, load_tokenizer, read_chat_template

        self.tokenizer = self.tokenizer or load_tokenizer(self.info.tokenizer_path)
        if self.args.chat_template is not None:
            self.tokenizer.chat_template = read_chat_template(self.args.chat_template)
        model = self.info.model_dir or self.info.tokenizer_path
        self.sampling_defaults = generation_defaults(model) if self.args.sampling_defaults == "model" else {}
        self.builder = RequestBuilder(
            self.tokenizer,
            self.info.vocab_size,
            self.info.context_len,
            self.info.max_total_num_tokens,
            self.args.max_new_tokens_limit,
            self.args.grammar_backend,
        )
        self.builder.max_requests = self.args.max_batch_size
        self.logprobs = LogprobCollector(self.tokenizer)
        self.token_bytes = TokenBytes(self.tokenizer)  # OpenAI logprobs' `bytes`
        self.model_name = self.args.served_model_name or self.info.model_path or "default"
        self.metrics = ServerMetrics(self.model_name)
        self.ctx = zmq.asyncio.Context()
        self.send_sock = zmq.Context.instance().socket(zmq.PUSH)
        self.send_sock.connect(self.ipc.scheduler)
        self.recv_sock = self.ctx.socket(zmq.PULL)
        self.recv_sock.bind(self.ipc.tokenizer)
        self._ids = itertools.count()
        self._task: Optional[asyncio.Task] = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._recv_loop())

    # -- generate -------------------------------------------------------------------------------
    def generate(self, g: GenerateInput) -> AsyncIterator[Event]:
        """Events for every request of the call until all are finished. Raises RadixflowError (bad input)
        before anything is queued: at once, or for a rid already in use, on the first iteration."""
        reqs = self.build(g)
        group = g.rid if isinstance(g.rid, str) and [r.rid for r in reqs] != [g.rid] else None
        return self._run(reqs, bool(g.stream), group)

    async def _run(self, reqs: list, stream: bool, group: Optional[str] = None) -> AsyncIterator[Event]:
        # the rids are checked where they are taken, with no wait in between: checked in generate(), a concurrent
        # call with the same rid could pass the check before this one took it, and take over its queue
        self._check_rids(reqs, group)
        if group is not None:
            self.groups[group] = [r.rid for r in reqs]
        queue: asyncio.Queue = asyncio.Queue()
        now = time.time()
        for i, r in enumerate(reqs):
            self.pending[r.rid] = Pending(r.rid, i, queue, now, r.logprob, last_time=now,
                                          req=r if self.args.log_requests else None, assembly=Assembly.with_texts(self.logprobs.with_text, r.logprob))
        self.send(TokenizedBatch(reqs, stream=stream))
        left = len(reqs)
        try:
            while left:
                event = await queue.get()
                left -= event.finished
                yield event
        finally:
            self.groups.pop(group, None)
            self._abort_unfinished([r.rid for r in reqs])

    def build(self, g: GenerateInput) -> list:
        self._check_alive()
        return self.builder.build(g)  # refuses more than --max-batch-size requests before making them

    def _check_rids(self, reqs: list, group: Optional[str] = None) -> None:
        self._sweep_abandoned()
        seen = set()
        for rid in [r.rid for r in reqs] + ([] if group is None else [group]):
            if rid in self.pending or rid in self.groups or rid in seen:
                raise RadixflowError(f"rid {rid!r} is already in use by a running request (one whose client left stays "
                                     "in use until the scheduler has stopped it, milliseconds); choose another rid")
            seen.add(rid)

    def _sweep_abandoned(self) -> None:
        """Forget requests whose caller left ABANDONED_KEEP_S ago and whose last report never came (the scheduler
        had dropped them), so that nothing keeps them, or their rids, for good."""
        cutoff = time.time() - ABANDONED_KEEP_S
        while self.abandoned:
            rid, p = next(iter(self.abandoned.items()))
            if p.abandoned > cutoff:
                break
            del self.abandoned[rid]
            if self.pending.get(rid) is p:
                del self.pending[rid]

    def _abort_unfinished(self, rids: list) -> None:
        """The call is over: its finished requests are forgotten; an unfinished one (its client left) is aborted
        and kept until its last report, so that a new request with its rid gets none of its reports (reused at
        once, the rid's old reports reached the new request: fuzzing, session 29)."""
        for rid in rids:
            p = self.pending.get(rid)
            if p is None:
                continue
            if p.last_report:
                del self.pending[rid]
            else:
                if not p.done:
                    self.send(AbortReq(rid))
                p.done, p.abandoned = True, time.time()
                self.abandoned[rid] = p
        self._sweep_abandoned()

    def abort(self, rid: Optional[str], abort_all: bool = False) -> None:
        """Abort `rid`: a request's, or the rid a call was sent with (all of its requests), or everything."""
        for one in self.groups.get(rid, [rid]) if not abort_all else [rid]:
            self.send(AbortReq(one, abort_all))

    def new_control(self) -> tuple[int, asyncio.Future]:
        """A control request's id and the future its reply will resolve (remove it from
        `controls` once done). Raises ServerDeadError when a child process died."""
        req_id = self.new_request_id()
        fut = asyncio.get_running_loop().create_future()
        self.controls[req_id] = fut
        return req_id, fut

    async def control(self, kind: str, timeout: float = 20.0, args: Any = None) -> Any:
        req_id, fut = self.new_control()
        self.send(ControlReq(kind, req_id, args=args))
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self.controls.pop(req_id, None)

    def new_request_id(self) -> int:
        """An id for a control or program message; raises ServerDeadError when a child died."""
        self._check_alive()
        return next(self._ids)

    def send(self, msg) -> None:
        self.send_sock.send_pyobj(msg)

    def _check_alive(self) -> None:
        if self.dead_reason:
            raise ServerDeadError(self.dead_reason)

    # -- outputs back ----------------------------------------------------------------------------
    async def _recv_loop(self) -> None:
        while True:
            msg = await self.recv_sock.recv_pyobj()
            try:
                self._handle(msg)
            except Exception:  # a bug must not end the loop that delivers every request's output
                log.exception("handling a %s failed", type(msg).__name__)

    def _handle(self, msg) -> None:
        if isinstance(msg, DetokBatch):
            self._dispatch(msg)
        elif isinstance(msg, ControlReply) and msg.req_id in self.program_streams:
            self.program_streams[msg.req_id].put_nowait(msg)
        elif isinstance(msg, ControlReply):
            fut = self.controls.get(msg.req_id)
            if fut is not None and not fut.done():
                fut.set_result(msg.result)
        elif isinstance(msg, ProgramDelta):
            q = self.program_streams.get(msg.req_id)
            if q is not None:
                q.put_nowait(msg)
        elif isinstance(msg, StatsSnapshot):
            self._on_stats(msg)

    def _on_stats(self, s: StatsSnapshot) -> None:
        self.stats = s
        self.metrics.on_stats(s)

    def _dispatch(self, batch: DetokBatch) -> None:
        if batch.stats is not None:
            self._on_stats(batch.stats)
        now = time.time()
        for out, text in zip(batch.outputs, batch.texts):
            p = self.pending.get(out.rid)
            if p is not None and p.abandoned:
                if out.finished:  # its last report: the rid is free again
                    del self.pending[out.rid]
                    self.abandoned.pop(out.rid, None)
            elif p is not None and p.done:  # failed by the delivery below: its last report still frees its rid
                p.last_report = p.last_report or out.finished
            elif p is not None:
                try:
                    self._deliver(p, out, text, now)
                except Exception as e:  # fail this request, keep delivering the others
                    log.exception("delivering an output of %s failed", out.rid)
                    p.done = True
                    self.send(AbortReq(out.rid))
                    error = f"internal error: {type(e).__name__}: {e}"
                    p.queue.put_nowait(Event(p.index, {"text": "", "output_ids": [], "meta_info": {"id": out.rid}},
                                             True, error, 500))  # fmt: skip

    def _deliver(self, p: Pending, out: ReqOutput, text: str, now: float) -> None:
        p.last_report = out.finished
        out = p.assembly.apply(out)
        reason = out.finish_reason or {}
        error = out.error
        if error is None and reason.get("status_code", 200) >= 400:  # rejected before it ran
            error = reason.get("message", "request rejected")
        finished = out.finished or error is not None
        self._record(p, out, now, finished)
        if finished and p.req is not None:
            request_log.log.info(request_log.finished_line(self.args.log_requests_level, p.req, out, text,
                                                           now - p.created, self.tokenizer.decode))
        p.done = finished
        if error is not None:
            self.send(AbortReq(out.rid))  # harmless if the scheduler already dropped it
        status = reason.get("status_code", 500) if error else 200
        p.queue.put_nowait(Event(p.index, self.result(p, out, text, finished, now), finished, error, status))

    def _record(self, p: Pending, out: ReqOutput, now: float, finished: bool) -> None:
        n = len(out.output_ids)
        self.metrics.on_tokens(p.last_len == 0, now - p.last_time, n - p.last_len, now - p.created)
        p.last_len, p.last_time = n, now
        if finished:
            self.metrics.on_finish(out.prompt_tokens, out.cached_tokens, now - p.created)

    def result(self, p: Pending, out: ReqOutput, text: str, finished: bool, now: float) -> dict:
        return build_result(out, text, p.logprob, finished, now - p.created)  # out's lists: the assembly's

    def fail_all(self, reason: str) -> None:
        """A child process died: every waiting caller gets an error now."""
        self.dead_reason = reason
        for p in list(self.pending.values()):
            if not p.done:
                p.done = True
                result = {"text": "", "output_ids": [], "meta_info": {"id": p.rid, "finish_reason": None}}
                p.queue.put_nowait(Event(p.index, result, True, reason, 503))
        for fut in self.controls.values():
            if not fut.done():
                fut.set_exception(ServerDeadError(reason))
        for req_id, q in self.program_streams.items():
            q.put_nowait(ControlReply(req_id, [{"results": {}, "meta_info": {}, "error": reason, "status_code": 503}]))
