"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions.

Requests map onto the same GenerateInput as the native /generate (one validation
path); SGLang's extra sampling fields (top_k, min_p, repetition_penalty, regex,
ignore_eos, ...) pass through. `usage.prompt_tokens_details.cached_tokens` is always
reported. Unknown request fields get a 400 that lists the accepted ones. Tools (prompt,
grammar, parsing) live in tool_request.py and tool_response.py.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from radixflow.errors import RadixflowError
from radixflow.runtime import sglang_fields
from radixflow.runtime.generate_request import GenerateInput
from radixflow.runtime.http_common import (
    SSE_DONE,
    final_results,
    json_response,
    open_stream,
    read_json,
    sse,
)
from radixflow.runtime.tokenizer_manager import Event, TokenizerManager
from radixflow.runtime.tool_request import ToolPlan, plan_tools
from radixflow.runtime.tool_response import ToolStream, tool_message

# OpenAI / SGLang request field -> sampling_params key
_SAMPLING_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "stop_regex": "stop_regex",
    "ignore_eos": "ignore_eos",
    "no_stop_trim": "no_stop_trim",
    "skip_special_tokens": "skip_special_tokens",
    "spaces_between_special_tokens": "spaces_between_special_tokens",
    "regex": "regex",
    "ebnf": "ebnf",
    "json_schema": "json_schema",
    "logit_bias": "logit_bias",
    "n": "n",
    "min_tokens": "min_new_tokens",
    "seed": "sampling_seed",
}
_COMMON = set(_SAMPLING_FIELDS) | {"model", "stream", "stream_options", "rid", "response_format", "max_tokens"}
_COMPLETION_FIELDS = _COMMON | {"prompt", "logprobs", "echo", "suffix"}
_CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
                          "continue_final_message", "chat_template_kwargs"}  # fmt: skip
_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}
_TEMPLATE_ARGS = {"conversation", "messages", "tokenize", "add_generation_prompt", "tools", "continue_final_message",
                  "return_dict", "return_tensors"}  # fmt: skip
_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass
class Call:
    """One OpenAI call mapped to a native generate call."""

    kind: str  # "completion" | "chat"
    g: GenerateInput
    n: int
    prompts: list  # prompt texts (for echo)
    echo: bool = False
    logprobs: bool = False
    include_usage: bool = False
    tools: Optional[ToolPlan] = None  # set when the output is decoded and parsed as tool calls
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))


def register_openai_routes(app: FastAPI) -> None:
    @app.get("/v1/models")
    async def models(request: Request):
        tm: TokenizerManager = request.app.state.tm
        card = {"id": tm.model_name, "object": "model", "created": int(time.time()), "owned_by": "radixflow",
                "root": tm.info.model_path or tm.info.model_dir, "max_model_len": tm.info.context_len}  # fmt: skip
        return json_response({"object": "list", "data": [card]})

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = _object(await read_json(request), _COMPLETION_FIELDS, sglang_fields.COMPLETION, "/v1/completions")
        return await _serve(request, completion_call(request.app.state.tm, body))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = _object(await read_json(request), _CHAT_FIELDS, sglang_fields.CHAT, "/v1/chat/completions")
        return await _serve(request, chat_call(request.app.state.tm, body))


def _object(body: Any, allowed: set, sglang_extras: dict, route: str) -> dict:
    if not isinstance(body, dict):
        raise RadixflowError(f"the request body must be a JSON object, got {type(body).__name__}")
    sglang_fields.check_fields(body, allowed, sglang_extras, route)
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise RadixflowError("model must be a string")
    return body


# -- request mapping ---------------------------------------------------------------------------------------------
def _sampling(body: dict, max_tokens: Any) -> dict:
    sp = {dst: body[src] for src, dst in _SAMPLING_FIELDS.items() if body.get(src) is not None}
    if max_tokens is not None:
        sp["max_new_tokens"] = max_tokens
    schema = _response_format(body.get("response_format"))
    if schema is not None:
        sp["json_schema"] = schema
    return sp


def _response_format(rf: Any) -> Optional[str]:
    if rf is None:
        return None
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise RadixflowError("response_format must be an object with a 'type'")
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return json.dumps({"type": "object"})
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise RadixflowError("response_format.json_schema must be an object with a 'schema' object")
        return json.dumps(spec["schema"])
    raise RadixflowError(f"response_format type {kind!r} is not supported; use text, json_object or json_schema")


def _stream_flags(body: dict) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    opts = body.get("stream_options") or {}
    if not isinstance(stream, bool):
        raise RadixflowError("stream must be true or false")
    if not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool):
        raise RadixflowError("stream_options must be an object like {\"include_usage\": true}")
    return stream, bool(opts.get("include_usage", False))


def _n(body: dict) -> int:
    n = body.get("n", 1)
    if n is None:
        return 1
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise RadixflowError(f"n must be an integer >= 1, got {n!r}")
    return n


def completion_call(tm: TokenizerManager, body: dict) -> Call:
    if body.get("suffix"):
        raise RadixflowError("suffix is not supported; put the whole prompt in 'prompt'")
    prompt = body.get("prompt")
    stream, usage = _stream_flags(body)
    text, ids, prompts = _completion_prompt(tm, prompt)
    k = body.get("logprobs")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= 20):
        raise RadixflowError("logprobs must be an integer in [0, 20] (the number of top tokens to return)")
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise RadixflowError("echo must be true or false")
    max_tokens = body.get("max_tokens", 16)
    g = GenerateInput(text=text, input_ids=ids, sampling_params=_sampling(body, 16 if max_tokens is None else max_tokens),
                      rid=body.get("rid"), return_logprob=k is not None, top_logprobs_num=k or 0,
                      logprob_start_len=0 if (echo and k is not None) else None,
                      return_text_in_logprobs=True, stream=stream)  # fmt: skip
    return Call("completion", g, _n(body), prompts, echo, k is not None, usage)


def _completion_prompt(tm: TokenizerManager, prompt: Any) -> tuple:
    """(text, input_ids, prompt texts) from a str, list of str, token ids or list of token ids."""
    if isinstance(prompt, str):
        return prompt, None, [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return prompt, None, prompt
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return None, prompt, [tm.tokenizer.decode(prompt)]
        if all(isinstance(p, list) for p in prompt):
            return None, prompt, [tm.tokenizer.decode(p) for p in prompt if _int_list(p)]
    raise RadixflowError("prompt must be a non-empty string, a list of strings, a list of token ids or a list of those")


def _int_list(p: list) -> bool:
    return all(isinstance(t, int) and not isinstance(t, bool) for t in p)


def chat_call(tm: TokenizerManager, body: dict) -> Call:
    stream, usage = _stream_flags(body)
    messages = _messages(body.get("messages"))
    tools = plan_tools(body, messages, tm.tokenizer, tm.args.tool_call_parser)
    text = tools.prompt if tools else _chat_prompt(tm, body, messages)
    ids = tm.tokenizer.encode(text, add_special_tokens=False)
    want_lp = body.get("logprobs", False)
    top = body.get("top_logprobs")
    if not isinstance(want_lp, bool):
        raise RadixflowError("logprobs must be true or false (use top_logprobs for the number of alternatives)")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 20 or not want_lp):
        raise RadixflowError("top_logprobs must be an integer in [0, 20], and needs logprobs: true")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:  # like OpenAI: up to the context length
        max_tokens = max(min(tm.info.context_len - len(ids), tm.args.max_new_tokens_limit), 0)
    sp = _sampling(body, max_tokens)
    if tools and tools.regex:
        sp["regex"] = tools.regex
    g = GenerateInput(input_ids=ids, sampling_params=sp, rid=body.get("rid"), return_logprob=want_lp,
                      top_logprobs_num=top or 0, return_text_in_logprobs=True, stream=stream)  # fmt: skip
    return Call("chat", g, _n(body), [text], False, want_lp, usage, tools if tools and tools.regex else None)


def _chat_prompt(tm: TokenizerManager, body: dict, messages: list) -> str:
    """The chat template applied to the messages; with continue_final_message a last
    assistant message is continued rather than followed by a new turn (as in SGLang)."""
    from radixflow.runtime.tokenizer import apply_chat_template

    kwargs = body.get("chat_template_kwargs") or {}
    cont = body.get("continue_final_message") or False
    if not isinstance(kwargs, dict) or not isinstance(cont, bool):
        raise RadixflowError("chat_template_kwargs must be an object and continue_final_message true or false")
    clash = sorted(set(kwargs) & _TEMPLATE_ARGS)
    if clash:
        raise RadixflowError(f"chat_template_kwargs may not set {', '.join(clash)}")
    cont = cont and messages[-1]["role"] == "assistant"
    return apply_chat_template(tm.tokenizer, messages, add_generation_prompt=not cont, continue_final_message=cont, **kwargs)


def _messages(messages: Any) -> list:
    if not isinstance(messages, list) or not messages:
        raise RadixflowError("messages must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise RadixflowError(f"messages[{i}] must be an object with role one of {', '.join(_ROLES)}")
        out.append({"role": m["role"], "content": _content(m.get("content"), i)})
    return out


def _content(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        if any(p.get("type") != "text" or not isinstance(p.get("text"), str) for p in content):
            raise RadixflowError(f"messages[{i}].content: only text parts are supported")
        return "".join(p["text"] for p in content)
    raise RadixflowError(f"messages[{i}].content must be a string or a list of text parts")


# -- serving -----------------------------------------------------------------------------------------------------------
async def _serve(request: Request, call: Call):
    tm: TokenizerManager = request.app.state.tm
    events = tm.generate(call.g)
    if call.g.stream:
        opened = await open_stream(request, events)
        if isinstance(opened, Response):
            return opened
        return StreamingResponse(_stream(tm, call, opened), media_type="text/event-stream")
    results = await final_results(request, events)
    if isinstance(results, Response):
        return results
    choices = [_choice(call, i, r) for i, r in enumerate(results)]
    obj = "text_completion" if call.kind == "completion" else "chat.completion"
    body = {"id": _id(call), "object": obj, "created": call.created, "model": tm.model_name, "choices": choices,
            "usage": usage(results, call.n)}  # fmt: skip
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


def _choice(call: Call, i: int, r: dict) -> dict:
    meta = r["meta_info"]
    if call.kind == "completion":
        text = (call.prompts[i // call.n] if call.echo else "") + r["text"]
        lp = _completion_logprobs(meta, call.echo) if call.logprobs else None
        return {"index": i, "text": text, "logprobs": lp, **_finish_fields(meta)}
    lp = {"content": _chat_logprobs(meta, 0)} if call.logprobs else None
    msg = {"role": "assistant", "content": r["text"], "reasoning_content": None, "tool_calls": None}
    fields = _finish_fields(meta)
    if call.tools:
        msg, fields["finish_reason"] = tool_message(call.tools.fmt, r["text"], fields["finish_reason"])
    return {"index": i, "message": msg, "logprobs": lp, **fields}


def usage(results: list, n: int) -> dict:
    """Prompt tokens count once per prompt (not per sample); cached tokens are those the
    first sample of each prompt found in the radix cache."""
    firsts = [r["meta_info"] for r in results[::n]]
    prompt = sum(m.get("prompt_tokens", 0) for m in firsts)
    completion = sum(r["meta_info"].get("completion_tokens", 0) for r in results)
    cached = sum(m.get("cached_tokens", 0) for m in firsts)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip


def _completion_logprobs(meta: dict, echo: bool, start: int = 0) -> dict:
    entries = (meta.get("input_token_logprobs") or []) if echo else []
    tops = (meta.get("input_top_logprobs") or []) if echo else []
    entries = entries + (meta.get("output_token_logprobs") or [])[start:]
    tops = tops + (meta.get("output_top_logprobs") or [])[start:]
    tokens = [e[2] or "" for e in entries]
    offsets, pos = [], 0
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    top = [None if t is None else {e[2] or "": e[0] for e in t} for t in tops] if tops else None
    return {"tokens": tokens, "token_logprobs": [e[0] for e in entries], "top_logprobs": top, "text_offset": offsets}


def _chat_logprobs(meta: dict, start: int) -> list:
    out = []
    tops = meta.get("output_top_logprobs") or []
    for k, e in enumerate((meta.get("output_token_logprobs") or [])[start:], start):
        alts = [_lp_entry(a) for a in tops[k]] if k < len(tops) else []
        out.append({**_lp_entry(e), "top_logprobs": alts})
    return out


def _lp_entry(e: list) -> dict:
    tok = e[2] or ""
    return {"token": tok, "logprob": e[0], "bytes": list(tok.encode("utf-8"))}


# -- streaming -----------------------------------------------------------------------------------------------------------
async def _stream(tm: TokenizerManager, call: Call, events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
    sent = [_Sent() for _ in range(_num_choices(call))]
    finals: dict = {}
    try:
        async for ev in events:
            if ev.error:
                yield sse({"error": {"message": ev.error, "type": "server_error", "code": ev.status_code}})
                continue
            yield sse(_chunk(tm, call, ev, sent[ev.index]))
            if ev.finished:
                finals[ev.index] = ev.result
        if call.include_usage and finals:
            results = [finals[i] for i in sorted(finals)]
            yield sse({**_chunk_head(tm, call), "choices": [], "usage": usage(results, call.n)})
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
        choice["logprobs"] = _completion_logprobs(meta, call.echo and first, start) if call.logprobs else None
    elif call.tools:
        sent.tools = sent.tools or ToolStream(call.tools.fmt)
        choice["delta"], choice["finish_reason"] = sent.tools.delta(r["text"], first, ev.finished, choice["finish_reason"])
    else:
        choice["delta"] = {"role": "assistant", "content": delta} if first else {"content": delta}
        choice["logprobs"] = {"content": _chat_logprobs(meta, start)} if call.logprobs else None
    return {**_chunk_head(tm, call), "choices": [choice]}
