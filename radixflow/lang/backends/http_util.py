"""Small HTTP helpers shared by the HTTP backends."""

from __future__ import annotations

import json
from typing import AsyncIterator, Iterator

import httpx

from radixflow.errors import RadixflowError


def check(r: httpx.Response, what: str) -> httpx.Response:
    if r.status_code >= 400:
        raise RadixflowError(f"{what} failed ({r.status_code}): {error_message(r)}")
    return r


def error_message(r: httpx.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return r.text.strip()[:500]
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        return str(err.get("message", err))
    return str(err or body)[:500]


def sse_events(r: httpx.Response) -> Iterator[dict]:
    """`data: {...}` events of a server-sent-event stream, until [DONE]."""
    for line in r.iter_lines():
        event = _event(line)
        if event is _DONE:
            return
        if event is not None:
            yield event


async def async_sse_events(r: httpx.Response) -> AsyncIterator[dict]:
    """sse_events for an httpx.AsyncClient's stream."""
    async for line in r.aiter_lines():
        event = _event(line)
        if event is _DONE:
            return
        if event is not None:
            yield event


_DONE = object()


def _event(line: str):
    """A line's event (None: not a data line; _DONE: the end); a stream's error event raised."""
    if not line.startswith("data:"):
        return None
    data = line[len("data:") :].strip()
    if data == "[DONE]":
        return _DONE
    event = json.loads(data)
    if isinstance(event, dict) and "error" in event:
        err = event["error"]
        raise RadixflowError(err.get("message", str(err)) if isinstance(err, dict) else str(err))
    return event


# An idle connection is dropped by the client before the server may close it: uvicorn closes one idle 5 s (httpx's
# own expiry), so a request sent on it as the server closed it failed with "Server disconnected without sending a
# response". radixflow's server keeps idle connections longer (launch_server.KEEP_ALIVE_S); SGLang's does not.
KEEPALIVE_EXPIRY_S = 2.0


def auth_headers(api_key) -> dict:
    """The Bearer header a server started with --api-key wants (none without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def client(base_url: str, api_key, timeout: float, verify=None) -> httpx.Client:
    """verify: TLS certificate checks as httpx takes them (None: httpx's default, checked)."""
    headers = auth_headers(api_key)
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64, keepalive_expiry=KEEPALIVE_EXPIRY_S)
    tls = {} if verify is None else {"verify": verify}
    return httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, limits=limits, **tls)
