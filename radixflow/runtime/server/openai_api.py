"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions.

Requests map onto the same GenerateInput as the native /generate (one validation
path); SGLang's extra sampling fields (top_k, min_p, repetition_penalty, regex,
ignore_eos, ...) pass through. `usage.prompt_tokens_details.cached_tokens` is always
reported. Request bodies are parsed in openai_request.py (unknown fields get a 400 that
lists the accepted ones); tool calls in responses are shaped by tool_response.py.
"""

from __future__ import annotations

import codecs
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Optional

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from radixflow.errors import RadixflowError
from radixflow.runtime import sglang_fields
from radixflow.runtime.reasoning import ReasoningStream, Split, reasoning_tokens
from radixflow.runtime.server.http_common import (
    SSE_DONE,
    HTTPError,
    final_results,
    json_response,
    open_stream,
    read_json,
    sse,
)
from radixflow.runtime.server.openai_request import (CHAT_FIELDS, COMPLETION_FIELDS, Call, chat_call, completion_call,
                                                      openai_names, parse_body)
from radixflow.runtime.server.tokenizer_manager import Event, TokenizerManager
from radixflow.runtime.server.tool_request import check_legacy_functions
from radixflow.runtime.server.tool_response import ToolStream, tool_message


def register_openai_routes(app: FastAPI) -> None:
    started = int(time.time())  # the card's `created`: the same on every call

    def card(tm: TokenizerManager) -> dict:
        return {"id": tm.model_name, "object": "model", "created": started, "owned_by": "radixflow",
                "root": tm.info.model_path or tm.info.model_dir, "max_model_len": tm.info.context_len}

    @app.get("/v1/models")
    async def models(request: Request):
        return json_response({"object": "list", "data": [card(request.app.state.tm)]})

    @app.get("/v1/models/{model:path}")
    async def model(request: Request, model: str):  # the client's models.retrieve(id)
        tm: TokenizerManager = request.app.state.tm
        if model != tm.model_name:
            raise HTTPError(404, f"model {model!r} is not served here; this server serves {tm.model_name!r}")
        return json_response(card(tm))

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = parse_body(await read_json(request), COMPLETION_FIELDS, sglang_fields.COMPLETION, "/v1/completions")
        return await _serve(request, completion_call(request.app.state.tm, body))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await read_json(request)
        check_legacy_functions(body)
        body = parse_body(body, CHAT_FIELDS, sglang_fields.CHAT, "/v1/chat/completions")
        return await _serve(request, chat_call(request.app.state.tm, body))


_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


# -- serving -----------------------------------------------------------------------------------------------------------
async def _serve(request: Request, call: Call):
    tm: TokenizerManager = request.app.state.tm
    try:
        events = tm.generate(call.g)
    except RadixflowError as e:  # its checks name sampling_params keys: say them as the request did
        if type(e) is not RadixflowError:  # a subclass (server busy or down) keeps its own status
            raise
        raise RadixflowError(openai_names(str(e))) from None
    if call.g.stream:
        opened = await open_stream(request, events, openai_names)
        if isinstance(opened, Response):
            return opened
        return StreamingResponse(_stream(tm, call, opened), media_type="text/event-stream")
    results = await final_results(request, events, openai_names)
    if isinstance(results, Response):
        return results
    parts = _reasoning_parts(call, results)
    choices = [_choice(tm, call, i, r, parts[i] if parts else None) for i, r in enumerate(results)]
    obj = "text_completion" if call.kind == "completion" else "chat.completion"
    body = {"id": _id(call), "object": obj, "created": call.created, "model": tm.model_name, "choices": choices,
            "usage": _usage(tm, call, results, parts)}  # fmt: skip
    return json_response(body)


def _id(call: Call) -> str:
    return ("cmpl-" if call.kind == "completion" else "chatcmpl-") + call.id


def _finish_fields(meta: dict) -> dict:
    """A choice's finish_reason and matched_stop, plus grammar_closed: true when a grammar
    was closed early to fit max_tokens (finish_reason "length")."""
    reason = meta.get("finish_reason")
    if not reason:
        return {"finish_reason": None, "matched_stop": None}
    fields = {"finish_reason": _FINISH.get(reason["type"], reason["type"]), "matched_stop": reason.get("matched")}
    if reason.get("grammar_closed"):
        fields["grammar_closed"] = True
    return fields


def _choice(tm: TokenizerManager, call: Call, i: int, r: dict, parts: Optional[Split]) -> dict:
    meta = r["meta_info"]
    if call.kind == "completion":
        text = (call.prompts[i // call.n] if call.echo else "") + r["text"]
        lp = _completion_logprobs(tm, meta, call.echo) if call.logprobs else None
        return {"index": i, "text": text, "logprobs": lp, **_finish_fields(meta)}
    lp = {"content": _chat_logprobs(tm, meta, 0)} if call.logprobs else None
    text, thinking = r["text"], None
    if parts is not None:
        text, thinking = parts.content, parts.reasoning or None  # an empty block has none, as its stream sends none
    msg = {"role": "assistant", "content": text, "reasoning_content": thinking, "tool_calls": None}
    fields = _finish_fields(meta)
    if call.tools:
        msg, fields["finish_reason"] = tool_message(call.tools.fmt, text, fields["finish_reason"])
        msg["reasoning_content"] = thinking
    return {"index": i, "message": msg, "logprobs": lp, **fields}


def _reasoning_parts(call: Call, results: list) -> Optional[list]:
    """Each finished output split into thinking and answer, with a reasoning parser (else None)."""
    return [call.reasoning.split(r["text"]) for r in results] if call.reasoning else None


def _usage(tm: TokenizerManager, call: Call, results: list, parts: Optional[list] = None) -> dict:
    """usage(), and with a reasoning parser the output tokens spent thinking (OpenAI's
    completion_tokens_details.reasoning_tokens, and SGLang's usage.reasoning_tokens). `parts`:
    _reasoning_parts(call, results), if the caller has them."""
    u = usage(results, call.n)
    parts = parts if parts is not None else _reasoning_parts(call, results)
    if parts is not None:
        spent = sum(reasoning_tokens(r["output_ids"], s, call.reasoning.fmt, tm.tokenizer) for r, s in zip(results, parts))
        u["completion_tokens_details"] = {"reasoning_tokens": spent}
        u["reasoning_tokens"] = spent
    return u


def usage(results: list, n: int) -> dict:
    """Prompt tokens count once per prompt (not per sample); cached tokens are those the
    first sample of each prompt found in the radix cache."""
    firsts = [r["meta_info"] for r in results[::n]]
    prompt = sum(m.get("prompt_tokens", 0) for m in firsts)
    completion = sum(r["meta_info"].get("completion_tokens", 0) for r in results)
    cached = sum(m.get("cached_tokens", 0) for m in firsts)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip


def _completion_logprobs(tm: TokenizerManager, meta: dict, echo: bool, start: int = 0,
                         at: Optional["_TextOffsets"] = None) -> dict:
    """Legacy completions' logprobs. `at`: where the choice's text stands (a stream's earlier chunks)."""
    entries = (meta.get("input_token_logprobs") or []) if echo else []
    tops = (meta.get("input_top_logprobs") or []) if echo else []
    entries = entries + (meta.get("output_token_logprobs") or [])[start:]
    tops = tops + (meta.get("output_top_logprobs") or [])[start:]
    at = _TextOffsets() if at is None else at
    offsets = [at.advance(tm, e) for e in entries]
    tokens = [_token_string(tm, e) for e in entries]
    tops = tops + [[]] * (len(entries) - len(tops))  # logprobs 0: no alternatives, the token itself below
    top = [None if e[0] is None else {**{_token_string(tm, a): a[0] for a in t or []}, tok: e[0]}
           for e, t, tok in zip(entries, tops, tokens)]  # OpenAI: "always the logprob of the sampled token"
    return {"tokens": tokens, "token_logprobs": [e[0] for e in entries], "top_logprobs": top, "text_offset": offsets}


def _token_string(tm: TokenizerManager, e: list) -> str:
    """A token as legacy completions show it: its text, or OpenAI's "bytes:\\xe7\\xbc" for part of a character."""
    text = e[2] or ""
    if "\ufffd" not in text:
        return text
    return "bytes:" + "".join(f"\\x{b:02x}" for b in tm.token_bytes(e[1]))


@dataclass
class _TextOffsets:
    """Characters of a choice's text before each token: the tokens' bytes decoded as they come, so a character
    spelled in several tokens starts where its first byte is and counts once."""

    pos: int = 0
    decoder: codecs.IncrementalDecoder = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))

    def advance(self, tm: TokenizerManager, e: list) -> int:
        at = self.pos
        special = e[1] in tm.token_bytes.special  # its text as the output shows it (empty where skipped)
        self.pos += len(e[2] or "") if special else len(self.decoder.decode(tm.token_bytes(e[1])))
        return at


def _chat_logprobs(tm: TokenizerManager, meta: dict, start: int) -> list:
    out = []
    tops = meta.get("output_top_logprobs") or []
    for k, e in enumerate((meta.get("output_token_logprobs") or [])[start:], start):
        alts = [_lp_entry(tm, a) for a in tops[k]] if k < len(tops) and tops[k] is not None else []
        out.append({**_lp_entry(tm, e), "top_logprobs": alts})
    return out


def _lp_entry(tm: TokenizerManager, e: list) -> dict:
    """An OpenAI logprob entry; `bytes` are the token's own (runtime/token_bytes.py): for a token holding part of a
    character, its text alone is U+FFFD."""
    return {"token": e[2] or "", "logprob": e[0], "bytes": list(tm.token_bytes(e[1]))}


# -- streaming -----------------------------------------------------------------------------------------------------------
async def _stream(tm: TokenizerManager, call: Call, events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
    sent = [_Sent() for _ in range(_num_choices(call))]
    finals: dict = {}
    try:
        async for ev in events:
            if ev.error:
                yield sse({"error": {"message": ev.error, "type": "server_error", "param": None, "code": ev.status_code}})
                continue
            yield sse(_chunk(tm, call, ev, sent[ev.index]))
            if ev.finished:
                finals[ev.index] = ev.result
        if call.include_usage and finals:
            results = [finals[i] for i in sorted(finals)]
            yield sse({**_chunk_head(tm, call), "choices": [], "usage": _usage(tm, call, results)})
        yield SSE_DONE
    finally:
        await events.aclose()


@dataclass
class _Sent:
    """How much of one choice's cumulative result was already streamed."""

    started: bool = False
    text: int = 0
    tokens: int = 0
    tools: Optional[ToolStream] = None
    reasoning: Optional[ReasoningStream] = None
    offsets: _TextOffsets = field(default_factory=_TextOffsets)  # legacy completions' text_offset


def _num_choices(call: Call) -> int:
    g = call.g
    prompts = len(g.text) if isinstance(g.text, list) else (len(g.input_ids) if g.is_batch else 1)
    return prompts * call.n


def _chunk_head(tm: TokenizerManager, call: Call) -> dict:
    obj = "text_completion" if call.kind == "completion" else "chat.completion.chunk"
    return {"id": _id(call), "object": obj, "created": call.created, "model": tm.model_name}


def _chunk(tm: TokenizerManager, call: Call, ev: Event, sent: _Sent) -> dict:
    i, r = ev.index, ev.result
    meta = r["meta_info"]
    first, start = not sent.started, sent.tokens
    delta = r["text"][sent.text :]
    sent.started, sent.text, sent.tokens = True, len(r["text"]), len(r["output_ids"])
    choice: dict = {"index": i, **_finish_fields(meta if ev.finished else {})}
    if call.kind == "completion":
        choice["text"] = (call.prompts[i // call.n] if call.echo and first else "") + delta
        choice["logprobs"] = _completion_logprobs(tm, meta, call.echo and first, start, sent.offsets) if call.logprobs else None
    else:
        thinking, new, answer = _split_delta(call, sent, r["text"], delta, ev.finished)
        if call.tools:
            sent.tools = sent.tools or ToolStream(call.tools.fmt)
            choice["delta"], choice["finish_reason"] = sent.tools.delta(answer, first, ev.finished, choice["finish_reason"])
        else:
            choice["delta"] = {"role": "assistant"} if first else {}
            if new or not thinking:
                choice["delta"]["content"] = new
        if thinking:
            choice["delta"]["reasoning_content"] = thinking
        choice["logprobs"] = {"content": _chat_logprobs(tm, meta, start)} if call.logprobs else None
    chunk = {**_chunk_head(tm, call), "choices": [choice]}
    if call.continuous_usage:  # this choice's counts so far
        done = meta.get("completion_tokens", len(r["output_ids"]))
        chunk["usage"] = {"prompt_tokens": meta.get("prompt_tokens", 0), "completion_tokens": done,
                          "total_tokens": meta.get("prompt_tokens", 0) + done}  # fmt: skip
    elif call.include_usage:  # as OpenAI: null on every chunk but the last (usage only)
        chunk["usage"] = None
    return chunk


def _split_delta(call: Call, sent: _Sent, text: str, delta: str, finished: bool) -> tuple[str, str, str]:
    """(new thinking, new answer text, the answer so far) of a chat choice; without a reasoning
    parser the whole text is the answer."""
    if call.reasoning is None:
        return "", delta, text
    sent.reasoning = sent.reasoning or call.reasoning.stream()
    thinking, new = sent.reasoning.delta(text, finished)
    return thinking, new, sent.reasoning.content
