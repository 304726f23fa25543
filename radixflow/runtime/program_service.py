"""Request graphs on the server: `POST /program`.

Main process: the route validates the program(s) (400 on a bad one), sends them to the
scheduler process as one `ProgramReq`, and awaits the `ControlReply` with the results.
Scheduler process: `SchedulerPrograms` runs them with a ProgramExecutor inside the
scheduler loop, and counts each program as one request in the server's metrics.

    POST /program {"program": {...}}          -> {"results", "meta_info", "error"}
    POST /program {"programs": [{...}, ...]}  -> a list of those, in order
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from radixflow.errors import RadixflowError
from radixflow.runtime.program_executor import ProgramExecutor
from radixflow.runtime.program_ops import parse_program
from radixflow.runtime.server_messages import ControlReply, ControlReq

PROGRAM_KIND = "program"


@dataclass
class ProgramReq(ControlReq):
    programs: list = field(default_factory=list)


# -- scheduler process ------------------------------------------------------------------------------
class SchedulerPrograms:
    """Hooked into the scheduler loop: `handle` new programs, `on_step` after each step."""

    def __init__(self, loop):
        self.loop = loop
        self.executor = ProgramExecutor(loop.scheduler, loop.scheduler.tokenizer)

    def handle(self, msg: ProgramReq) -> None:
        results: list = [None] * len(msg.programs)
        left = [len(msg.programs)]

        def done(i: int, out: dict) -> None:
            results[i] = out
            left[0] -= 1
            if left[0] == 0:
                self.loop._send(ControlReply(msg.req_id, results))

        for i, program in enumerate(msg.programs):
            try:
                self.executor.submit(program, lambda out, i=i: done(i, out))
            except RadixflowError as e:
                done(i, {"results": {}, "meta_info": {}, "error": str(e)})
        self.executor.on_step()

    def has_work(self) -> bool:
        return self.executor.has_work()

    def on_step(self) -> None:
        self.executor.on_step()


# -- main process ---------------------------------------------------------------------------------------
def parse_program_body(body: Any) -> tuple[list, bool]:
    """(programs, single) from a /program body; raises RadixflowError."""
    if not isinstance(body, dict):
        raise RadixflowError('the body must be a JSON object: {"program": {...}} or {"programs": [...]}')
    if "programs" in body:
        programs, single = body["programs"], False
        if not isinstance(programs, list) or not programs:
            raise RadixflowError("programs must be a non-empty list")
    elif "program" in body:
        programs, single = [body["program"]], True
    else:
        raise RadixflowError('give "program" (one request graph) or "programs" (a list)')
    for p in programs:
        parse_program(p)
    return programs, single


async def submit_programs(tm, programs: list) -> list:
    """Send programs to the scheduler process and wait for their results."""
    tm._check_alive()
    req_id = next(tm._ids)
    fut = asyncio.get_running_loop().create_future()
    tm.controls[req_id] = fut
    tm._send(ProgramReq(PROGRAM_KIND, req_id, programs))
    try:
        outs = await fut
    finally:
        tm.controls.pop(req_id, None)
    for out in outs:
        meta = out.get("meta_info") or {}
        tm.metrics.on_finish(meta.get("prompt_tokens", 0), meta.get("cached_tokens", 0), meta.get("e2e_latency", 0.0))
    return outs


def register_program_routes(app) -> None:
    from radixflow.runtime.http_common import json_response, read_json

    @app.post("/program")
    async def program(request: Request):
        programs, single = parse_program_body(await read_json(request))
        outs = await submit_programs(request.app.state.tm, programs)
        return json_response(outs[0] if single else outs)
