"""Request graphs on the server: `POST /program`.

Main process: the route validates the program(s) (400 on a bad one), sends them to the
scheduler process as one `ProgramReq`, and awaits the `ControlReply` with the results.
Scheduler process: `SchedulerPrograms` runs them with a ProgramExecutor inside the
scheduler loop, and counts each program as one request in the server's metrics.

    POST /program {"program": {...}}          -> {"results", "meta_info", "error"}
    POST /program {"programs": [{...}, ...]}  -> a list of those, in order
    POST /program {"program": {...}, "stream": true}
        -> server-sent events: {"var", "text"} deltas of the program's main strand
           (`ProgramDelta`s from the scheduler process), then {"results", "meta_info"}
           (or {"error": {"message", "code"}}), then [DONE]

Errors known before running (a bad program, a gen's sampling params, more requests at
once than --max-batch-size, a grammar that cannot fit max_new_tokens) are 400s. A client
that disconnects, `/abort_request {"rid": <program rid>}` and `abort_all` stop a program
and free its requests' KV at once.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Optional

from fastapi import Request
from fastapi.responses import StreamingResponse

from radixflow.errors import RadixflowError
from radixflow.runtime.server.http_common import (
    SSE_DONE,
    error_response,
    json_response,
    read_json,
    sse,
    until_done_or_disconnected,
)
from radixflow.runtime.programs.program_executor import ProgramExecutor
from radixflow.runtime.programs.program_ops import check_programs
from radixflow.runtime.programs.program_stream import delta_event
from radixflow.runtime.programs.text_pieces import constant_pieces
from radixflow.runtime.server.server_messages import ControlReply, ControlReq, ProgramDelta

PROGRAM_KIND = "program"


@dataclass
class ProgramReq(ControlReq):
    programs: list = field(default_factory=list)
    stream: bool = False  # one program whose main strand's text comes back as ProgramDeltas
    pieces: list = field(default_factory=list)  # per program, its constant text tokenized (text_pieces.py)
    ops: list = field(default_factory=list)  # per program, its parsed ops (program_ops.parse_program)


# -- scheduler process ------------------------------------------------------------------------------
class SchedulerPrograms:
    """Hooked into the scheduler loop: `handle` new programs, `on_step` after each step."""

    def __init__(self, executor: ProgramExecutor, send: Callable[[Any], None]):
        """`send`: hands a reply message to the tokenizer manager."""
        self.executor = executor
        self.send = send

    def handle(self, msg: ProgramReq) -> None:
        results: list = [None] * len(msg.programs)
        left = [len(msg.programs)]

        def done(i: int, out: dict) -> None:
            results[i] = out
            left[0] -= 1
            if left[0] == 0:
                self.send(ControlReply(msg.req_id, results))

        on_delta = None
        if msg.stream:
            on_delta = lambda var, text, meta: self.send(ProgramDelta(msg.req_id, var, text, meta))  # noqa: E731
        for i, program in enumerate(msg.programs):
            try:
                pieces, ops = msg.pieces[i] if msg.pieces else None, msg.ops[i] if msg.ops else None
                self.executor.submit(program, lambda out, i=i: done(i, out), on_delta, pieces, ops)
            except RadixflowError as e:
                done(i, {"results": {}, "meta_info": {}, "error": str(e), "status_code": 400})
        self.executor.on_step()

    def abort(self, rid: Optional[str]) -> None:
        """Abort the program `rid` (None: all); its requests' KV is freed at once."""
        self.executor.abort(rid)

    def has_work(self) -> bool:
        return self.executor.has_work()

    def on_step(self) -> None:
        self.executor.on_step()


# -- main process ---------------------------------------------------------------------------------------
def parse_program_body(body: Any, builder, max_requests: int) -> tuple[list, list, bool]:
    """(programs, their parsed ops, single) from a /program body, each program with a rid;
    raises RadixflowError for anything wrong before running (see program_ops.check_programs)."""
    if not isinstance(body, dict):
        raise RadixflowError('the body must be a JSON object: {"program": {...}} or {"programs": [...]}')
    unknown = sorted(set(body) - {"program", "programs", "stream"})
    if unknown:
        raise RadixflowError(f"unknown field(s) for /program: {', '.join(unknown)}; accepted: program, programs, stream")
    if len(set(body) - {"stream"}) != 1:
        raise RadixflowError('give exactly one of "program" (one request graph) or "programs" (a list)')
    if not isinstance(body.get("stream", False), bool) or (body.get("stream") and "programs" in body):
        raise RadixflowError('"stream" must be true or false, and streams one "program"')
    if "programs" in body:
        programs, single = body["programs"], False
        if not isinstance(programs, list) or not programs:
            raise RadixflowError("programs must be a non-empty list")
    else:
        programs, single = [body["program"]], True
    ops = check_programs(programs, builder.sampling, max_requests)
    rids = [p.get("rid") for p in programs if isinstance(p, dict) and p.get("rid")]
    if len(set(rids)) < len(rids):  # an abort by rid would reach only one of them
        raise RadixflowError("two programs of the call have the same rid; give each its own (or none)")
    return [{**p, "rid": p.get("rid") or uuid.uuid4().hex} for p in programs], ops, single


async def submit_programs(tm, request: Request, programs: list, ops: list) -> Optional[list]:
    """Send programs (and their parsed `ops`) to the scheduler process and wait for their
    results; None if the client went away first (then the programs are aborted, which frees
    their KV)."""
    req_id, fut = tm.new_control()
    tm.send(ProgramReq(PROGRAM_KIND, req_id, programs, pieces=_pieces(tm, ops), ops=ops))
    try:
        if not await until_done_or_disconnected(request, fut):
            for p in programs:
                tm.abort(p["rid"])
            return None
        outs = fut.result()
    finally:
        tm.controls.pop(req_id, None)
    for out in outs:
        _count(tm, out)
    return outs


def stream_program(tm, program: dict, ops: list) -> AsyncIterator[bytes]:
    """The SSE events of one streamed program (`ops`: its parsed ops); stopping early (the
    client went away) aborts it, which frees its KV."""
    req_id = tm.new_request_id()
    queue: asyncio.Queue = asyncio.Queue()
    tm.program_streams[req_id] = queue
    tm.send(ProgramReq(PROGRAM_KIND, req_id, [program], stream=True, pieces=_pieces(tm, [ops]), ops=[ops]))

    async def events() -> AsyncIterator[bytes]:
        finished = False
        try:
            while not finished:
                msg = await queue.get()
                if isinstance(msg, ProgramDelta):
                    yield sse(delta_event(msg.var, msg.text, msg.meta))
                    continue
                finished = True
                yield sse(_final_event(tm, msg.result[0]))
            yield SSE_DONE
        finally:
            tm.program_streams.pop(req_id, None)
            if not finished:
                tm.abort(program["rid"])

    return events()


def _pieces(tm, ops: list) -> list:
    """Each program's constant text tokenized here, as /generate's prompts are, not in the
    scheduler process's loop."""
    return [constant_pieces(tm.tokenizer, o) for o in ops]


def _final_event(tm, out: dict) -> dict:
    status = out.pop("status_code", 200)
    error = out.pop("error", None)
    if error is not None and status >= 400:
        return {"error": {"message": error, "code": status}}
    _count(tm, out)
    return out if error is None else {**out, "error": error}


def _count(tm, out: dict) -> None:
    meta = out.get("meta_info") or {}
    tm.metrics.on_finish(meta.get("prompt_tokens", 0), meta.get("cached_tokens", 0), meta.get("e2e_latency", 0.0),
                         generated=meta.get("completion_tokens", 0))  # fmt: skip


def register_program_routes(app) -> None:
    @app.post("/program")
    async def program(request: Request):
        tm = request.app.state.tm
        body = await read_json(request)
        programs, ops, single = parse_program_body(body, tm.builder, tm.args.max_batch_size)
        if body.get("stream"):
            return StreamingResponse(stream_program(tm, programs[0], ops[0]), media_type="text/event-stream")
        outs = await submit_programs(tm, request, programs, ops)
        if outs is None:
            return error_response(499, "client disconnected")
        statuses = [out.pop("status_code", 200) for out in outs]
        failed = next((i for i, code in enumerate(statuses) if code >= 400), None)
        if failed is not None:  # as for /generate: the call fails with its first error
            return error_response(statuses[failed], outs[failed]["error"])
        return json_response(outs[0] if single else outs)
