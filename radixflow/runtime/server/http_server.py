"""The HTTP server (FastAPI): SGLang's native routes, the OpenAI routes (openai_api.py),
auth, request limits and `{"error": {"message": ...}}` error bodies.

Auth: with --api-key every route except GET /health (/ready, /ping) needs `Authorization: Bearer KEY`
(unlike SGLang, /metrics and /health_generate are protected too: they reveal load and
run the model).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
from typing import Any, AsyncIterator, Optional

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixflow.errors import RadixflowError, ServerBusyError
from radixflow.runtime.generate_request import GenerateInput
from radixflow.runtime.server.http_common import (
    SSE_DONE,
    HTTPError,
    final_results,
    error_response,
    first_error,
    json_response,
    open_stream,
    read_json,
    sse,
)
from radixflow.runtime import reasoning, sglang_fields
from radixflow.runtime.server.openai_api import register_openai_routes
from radixflow.runtime.server.program_service import register_program_routes
from radixflow.runtime.server.step_profiler import parse_profile
from radixflow.runtime.server.tokenize_api import register_tokenize_routes
from radixflow.runtime.server.tokenizer_manager import Event, ServerDeadError, TokenizerManager

OPEN_ROUTES = frozenset({"/health", "/ready", "/ping"})
HEALTH_GENERATE_TIMEOUT_S = 20.0
_GENERATE_FIELDS = {
    "text": None,
    "input_ids": None,
    "sampling_params": None,
    "rid": None,
    "return_logprob": False,
    "logprob_start_len": None,
    "top_logprobs_num": 0,
    "return_text_in_logprobs": False,
    "stream": False,
    "token_ids_logprob": None,
}


# -- auth and size limit (plain ASGI, so streaming and disconnects pass through untouched) ----------------
class GuardMiddleware:
    def __init__(self, app, api_key: Optional[str], max_body_bytes: int):
        self.app = app
        self.key = f"Bearer {api_key}".encode() if api_key else None
        self.max_body = max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if self.key is not None and scope["path"] not in OPEN_ROUTES:
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.key):
                msg = "missing or wrong API key; send the header 'Authorization: Bearer <key>'"
                return await error_response(401, msg)(scope, receive, send)
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            msg = f"the request body is over {self.max_body} bytes; send less or raise --max-body-bytes"
            return await error_response(413, msg)(scope, receive, send)
        return await self.app(scope, receive, send)


# -- the app ---------------------------------------------------------------------------------------------------
def create_app(tm: TokenizerManager) -> FastAPI:
    app = FastAPI(title="radixflow", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.tm = tm
    app.state.args = tm.args
    _register_errors(app)
    _register_native(app)
    register_openai_routes(app)
    register_program_routes(app)  # request graphs (runtime/server/program_service.py)
    register_tokenize_routes(app)
    app.add_middleware(GuardMiddleware, api_key=tm.args.api_key, max_body_bytes=tm.args.max_body_bytes)
    return app


def _register_errors(app: FastAPI) -> None:
    @app.exception_handler(HTTPError)
    async def _http_error(request, exc: HTTPError):
        return error_response(exc.status, exc.message)

    @app.exception_handler(RadixflowError)
    async def _user_error(request, exc: RadixflowError):
        return error_response(400, str(exc))

    @app.exception_handler(ServerBusyError)
    async def _busy(request, exc: ServerBusyError):
        return error_response(503, str(exc))

    @app.exception_handler(ServerDeadError)
    async def _dead(request, exc: ServerDeadError):
        return error_response(503, str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _starlette(request, exc: StarletteHTTPException):
        allow = (exc.headers or {}).get("Allow")
        if exc.status_code == 405 and allow:  # say which methods the route takes, and keep the Allow header
            response = error_response(405, f"{request.method} is not allowed on {request.url.path}; use {allow}")
            response.headers["Allow"] = allow
            return response
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _internal(request, exc: Exception):
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")


def parse_generate(body: Any) -> GenerateInput:
    if not isinstance(body, dict):
        raise RadixflowError(f"the request body must be a JSON object, got {type(body).__name__}")
    if "prompt" in body and "text" not in body and "input_ids" not in body:
        raise RadixflowError("/generate takes 'text' (or 'input_ids'), not 'prompt'")
    sglang_fields.check_fields(body, set(_GENERATE_FIELDS), sglang_fields.GENERATE, "/generate")
    args = {k: default if body.get(k) is None else body[k] for k, default in _GENERATE_FIELDS.items()}
    for name in ("stream", "return_text_in_logprobs"):
        if not isinstance(args[name], bool):
            raise RadixflowError(f"{name} must be true or false")
    return GenerateInput(**args)


def _register_native(app: FastAPI) -> None:
    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request):
        tm: TokenizerManager = request.app.state.tm
        g = parse_generate(await read_json(request))
        events = tm.generate(g)
        # one prompt and one sample: a bare result (stream chunks without "index"); n > 1 is a list, as a batch
        single = not g.is_batch and not (isinstance(g.sampling_params, dict) and (g.sampling_params.get("n") or 1) > 1)
        if g.stream:
            opened = await open_stream(request, events)
            if isinstance(opened, Response):
                return opened
            return StreamingResponse(_native_stream(opened, single), media_type="text/event-stream")
        results = await final_results(request, events)
        if isinstance(results, Response):
            return results
        return json_response(results[0] if single else results)

    @app.get("/health")
    @app.get("/ready")  # SGLang's other names for it (load balancers and Kubernetes probes use them)
    @app.get("/ping")
    async def health(request: Request):
        tm: TokenizerManager = request.app.state.tm
        if tm.dead_reason:
            return error_response(503, tm.dead_reason)
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate(request: Request):
        tm: TokenizerManager = request.app.state.tm
        g = GenerateInput(input_ids=[0], sampling_params={"max_new_tokens": 1})
        try:
            events = tm.generate(g)
            finals = await asyncio.wait_for(_drain_finals(events), HEALTH_GENERATE_TIMEOUT_S)
        except (asyncio.TimeoutError, ServerDeadError) as e:
            return error_response(503, f"unhealthy: {e or 'no output within 20 s'}")
        err = first_error(finals)
        return error_response(503, f"unhealthy: {err.error}") if err else Response(status_code=200)

    @app.api_route("/get_model_info", methods=["GET"])
    @app.api_route("/model_info", methods=["GET"])
    async def model_info(request: Request):
        return json_response(model_info_dict(request.app.state.tm))

    @app.api_route("/get_server_info", methods=["GET"])
    @app.api_route("/server_info", methods=["GET"])
    async def server_info(request: Request):
        tm: TokenizerManager = request.app.state.tm
        sched = await tm.control("server_info")
        args = {k: v for k, v in dataclasses.asdict(tm.args).items() if k != "api_key"}
        from radixflow.version import __version__

        pids = {f"{name}_pid": pid for name, pid in tm.child_pids.items()}
        names = {"served_model_name": tm.model_name, "model_path": tm.info.model_path or tm.info.model_dir}
        body = {**args, **names, **sched, **pids, "internal_states": [sched], "version": __version__}
        return json_response(body)

    @app.get("/get_load")
    async def get_load(request: Request):
        """SGLang's load report, one entry per data-parallel rank (here one); sglang-router reads it."""
        sched = await request.app.state.tm.control("server_info")
        running, waiting = sched["num_running_reqs"], sched["num_waiting_reqs"]
        held = sched["request_slots"] + sched["locked_cached_slots"]  # KV of running requests, not idle cache
        load = {"dp_rank": 0, "num_reqs": running + waiting, "num_waiting_reqs": waiting, "num_tokens": held}
        return json_response([load])

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(request: Request):
        ok = await request.app.state.tm.control("flush_cache")
        if ok:
            return PlainTextResponse("Cache flushed.\n")
        return PlainTextResponse("Cache not flushed: requests are running; retry when the server is idle.\n", 400)

    @app.api_route("/start_profile", methods=["GET", "POST"])
    async def start_profile(request: Request):
        empty = request.headers.get("content-length") in (None, "0")  # SGLang's clients may send no body
        asked = parse_profile(None if empty else await read_json(request))
        started = await request.app.state.tm.control("start_profile", args=asked)
        if "error" in started:
            raise RadixflowError(started["error"])
        return PlainTextResponse(f"Start profiling. The trace will be written to {started['path']}\n")

    @app.api_route("/stop_profile", methods=["GET", "POST"])
    async def stop_profile(request: Request):
        stopped = await request.app.state.tm.control("stop_profile", timeout=120.0)  # writing a trace takes a while
        if "error" in stopped:
            raise RadixflowError(stopped["error"])
        return PlainTextResponse(f"Stop profiling. The trace is at {stopped['path']}\n")

    @app.post("/abort_request")
    async def abort_request(request: Request):
        body = await read_json(request)
        if not isinstance(body, dict):
            raise RadixflowError("the request body must be a JSON object {rid, abort_all}")
        sglang_fields.check_fields(body, {"rid", "abort_all"}, {}, "/abort_request")
        rid, abort_all = body.get("rid"), body.get("abort_all", False)
        if not isinstance(abort_all, bool) or (rid is not None and not isinstance(rid, str)):
            raise RadixflowError("rid must be a string and abort_all true or false")
        if rid is None and not abort_all:
            raise RadixflowError("give a rid to abort, or abort_all: true")
        request.app.state.tm.abort(rid, abort_all)
        return Response(status_code=200)

    @app.post("/concate_and_append_request")
    async def concate_and_append_request(request: Request):
        """SGLang's frontend calls this at join("concate_and_append") and then sends the joined
        text. The radix cache already reuses KV by tokens, so there is nothing to move here."""
        body = await read_json(request)
        src, dst = (body.get("src_rids"), body.get("dst_rid")) if isinstance(body, dict) else (None, None)
        if not isinstance(src, list) or not all(isinstance(r, str) for r in src) or not isinstance(dst, str):
            raise RadixflowError("the body must be {src_rids: [string, ...], dst_rid: string}")
        return {"success": True}

    @app.post("/separate_reasoning")
    async def separate_reasoning(request: Request):
        """SGLang's route: {text, reasoning_parser} -> {text: the answer, reasoning_text}
        (runtime/reasoning.py; the parser defaults to the server's --reasoning-parser)."""
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("text"), str):
            raise RadixflowError("the body must be {text: string, reasoning_parser: string}")
        sglang_fields.check_fields(body, {"text", "reasoning_parser"}, {}, "/separate_reasoning")
        name = body.get("reasoning_parser") or request.app.state.tm.args.reasoning_parser
        if name is None:
            raise RadixflowError(f"give reasoning_parser, one of {', '.join(reasoning.NAMES)}")
        s = reasoning.split(body["text"], reasoning.get_format(name))
        return {"text": s.content, "reasoning_text": s.reasoning}

    @app.get("/metrics")
    async def metrics(request: Request):
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(request.app.state.tm.metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def _drain_finals(events: AsyncIterator[Event]) -> dict:
    return {ev.index: ev async for ev in events if ev.finished}


async def _native_stream(events: AsyncIterator[Event], single: bool) -> AsyncIterator[bytes]:
    try:
        async for ev in events:
            if ev.error:
                yield sse({"error": {"message": ev.error, "type": "server_error", "code": ev.status_code, "retryable": False}})
                continue
            out = ev.result if single else {**ev.result, "index": ev.index}
            yield sse(out)
        yield SSE_DONE
    finally:
        await events.aclose()


def model_info_dict(tm: TokenizerManager) -> dict:
    info = tm.info
    return {
        "model_path": info.model_path or info.model_dir,
        "served_model_name": tm.model_name,
        "tokenizer_path": info.tokenizer_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "architectures": info.architectures,
        "context_length": info.context_len,
        "vocab_size": info.vocab_size,
        "chat_template": tm.tokenizer.chat_template if tm.args.chat_template else None,  # --chat-template's
    }
