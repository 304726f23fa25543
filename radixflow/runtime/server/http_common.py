"""Helpers shared by the native and OpenAI routes: JSON bodies with a size limit,
error responses, SSE framing, and waiting for results while watching the client."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Callable, Optional

import orjson
from fastapi import Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from radixflow.runtime.server.tokenizer_manager import Event

DISCONNECT_POLL_S = 0.5


class HTTPError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


# -- helpers shared with openai_api.py -------------------------------------------------------------------
def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def error_response(status: int, message: str, kind: Optional[str] = None) -> Response:
    err = {"message": message, "type": kind or _error_type(status), "param": None, "code": status}  # OpenAI's keys
    return json_response({"error": err}, status)


def _error_type(status: int) -> str:
    named = {401: "authentication_error", 404: "not_found_error", 413: "request_too_large"}
    return named.get(status, "invalid_request_error" if 400 <= status < 500 else "server_error")


async def read_json(request: Request) -> Any:
    """The body as JSON, at most max_body_bytes (413 above), 400 if it is not JSON."""
    limit = request.app.state.args.max_body_bytes
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPError(413, f"the request body is over {limit} bytes; send less or raise --max-body-bytes")
            chunks.append(chunk)
    except ClientDisconnect:  # gone while sending its body: nothing to answer (was a logged traceback)
        raise HTTPError(499, "client disconnected") from None
    raw = b"".join(chunks)
    if not raw.strip():
        raise HTTPError(400, "the request body is empty; send a JSON object")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise HTTPError(400, f"malformed JSON body: {e}") from None


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


async def collect(request: Request, events: AsyncIterator[Event]) -> Optional[dict]:
    """Final events by index; None if the client went away (what ran is aborted)."""
    finals: dict = {}

    async def drain() -> None:
        async for ev in events:
            if ev.finished:
                finals[ev.index] = ev

    task = asyncio.ensure_future(drain())
    try:
        if not await until_done_or_disconnected(request, task):
            return None
        task.result()
        return finals
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def until_done_or_disconnected(request: Request, fut: asyncio.Future) -> bool:
    """Wait for `fut`; False as soon as the client is seen gone (checked every half second)."""
    while True:
        done, _ = await asyncio.wait({fut}, timeout=DISCONNECT_POLL_S)
        if done:
            return True
        if await request.is_disconnected():
            return False


async def final_results(request: Request, events: AsyncIterator[Event],
                        names: Callable[[str], str] = str) -> "list[dict] | Response":
    """The results of a non-streamed call in order, or the error response to send (`names`: how its message
    names sampling parameters; the OpenAI routes say max_tokens)."""
    finals = await collect(request, events)
    if finals is None:
        return error_response(499, "client disconnected")
    err = first_error(finals)
    if err is not None:
        return error_response(err.status_code, names(err.error))
    return [finals[i].result for i in sorted(finals)]


def first_error(finals: dict) -> Optional[Event]:
    return next((ev for ev in finals.values() if ev.error), None)


async def open_stream(request: Request, events: AsyncIterator[Event],
                      names: Callable[[str], str] = str) -> "AsyncIterator[Event] | Response":
    """Wait for a stream's first event before answering: a request rejected before it ran
    (e.g. a grammar that cannot fit max_new_tokens) gets its 400 as the HTTP status (`names`: as final_results)."""
    task = asyncio.ensure_future(events.__anext__())
    if not await until_done_or_disconnected(request, task):
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await events.aclose()
        return error_response(499, "client disconnected")
    first = task.result()
    if first.error is not None and first.status_code == 400:
        await events.aclose()
        return error_response(400, names(first.error))
    return _prepend(first, events)


async def _prepend(first: Event, events: AsyncIterator[Event]) -> AsyncIterator[Event]:
    try:
        yield first
        async for ev in events:
            yield ev
    finally:
        await events.aclose()
