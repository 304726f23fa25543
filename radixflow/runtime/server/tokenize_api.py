"""/tokenize and /detokenize (also under /v1/): the server's own tokenizer over HTTP, in SGLang's and vLLM's
shapes, so a client can count a prompt against the context before sending it.

    POST /tokenize   {"prompt": "Hello"}            -> {"tokens": [...], "count": 2, "max_model_len": 8192}
                     {"prompt": ["a", "b"]}         -> tokens and count per prompt
                     {"messages": [...]}            -> the chat prompt, as /v1/chat/completions renders it
    POST /detokenize {"tokens": [19556, 28]}        -> {"text": "Hello!"}   (or a list of lists -> a list)
"""

from __future__ import annotations

from typing import Any, Callable

from fastapi import FastAPI, Request

from radixflow.errors import RadixflowError
from radixflow.runtime.generate_request import token_ids_in
from radixflow.runtime.server.http_common import json_response, read_json
from radixflow.runtime.server.openai_request import chat_prompt_text, flag, parse_body
from radixflow.runtime.server.tokenizer_manager import TokenizerManager

_CHAT_ONLY = ("continue_final_message", "add_generation_prompt", "chat_template_kwargs", "tools", "tool_choice",
              "parallel_tool_calls", "reasoning_effort")  # the fields that shape a chat prompt
TOKENIZE_FIELDS = {"model", "prompt", "messages", "add_special_tokens", *_CHAT_ONLY}
DETOKENIZE_FIELDS = {"model", "tokens", "skip_special_tokens"}


def register_tokenize_routes(app: FastAPI) -> None:
    _register(app, ("/tokenize", "/v1/tokenize"), TOKENIZE_FIELDS, tokenize_body)
    _register(app, ("/detokenize", "/v1/detokenize"), DETOKENIZE_FIELDS, detokenize_body)


def _register(app: FastAPI, paths: tuple, fields: set, handle: Callable[[TokenizerManager, dict], dict]) -> None:
    async def route(request: Request):
        body = parse_body(await read_json(request), fields, {}, request.url.path)
        return json_response(handle(request.app.state.tm, body))

    for path in paths:
        app.post(path)(route)


def tokenize_body(tm: TokenizerManager, body: dict) -> dict:
    prompt, messages = body.get("prompt"), body.get("messages")
    if (prompt is None) == (messages is None):
        raise RadixflowError("send exactly one of 'prompt' (a string or a list of strings) and 'messages'")
    special = flag(body, "add_special_tokens", messages is None)  # a chat template writes its own special tokens
    if messages is not None:
        prompt = chat_prompt_text(tm, body)
    elif not isinstance(prompt, str) and not (isinstance(prompt, list) and all(isinstance(p, str) for p in prompt)):
        raise RadixflowError("prompt must be a string or a list of strings")
    elif given := [f for f in _CHAT_ONLY if body.get(f) is not None]:
        raise RadixflowError(f"{', '.join(given)} apply to 'messages' only")
    if isinstance(prompt, str):
        tokens = tm.tokenizer.encode(prompt, add_special_tokens=special)
        count: Any = len(tokens)
    else:
        tokens = [tm.tokenizer.encode(p, add_special_tokens=special) for p in prompt]
        count = [len(t) for t in tokens]
    return {"tokens": tokens, "count": count, "max_model_len": tm.info.context_len}


def detokenize_body(tm: TokenizerManager, body: dict) -> dict:
    tokens = body.get("tokens")
    skip = flag(body, "skip_special_tokens", True)
    nested = isinstance(tokens, list) and bool(tokens) and all(isinstance(t, list) for t in tokens)
    for ids in tokens if nested else [tokens]:
        if not isinstance(ids, list) or not token_ids_in(ids, tm.info.vocab_size):
            raise RadixflowError(f"tokens must be a list of token ids in [0, {tm.info.vocab_size}), or a list of such lists")
    if nested:
        return {"text": [tm.tokenizer.decode(ids, skip_special_tokens=skip) for ids in tokens]}
    return {"text": tm.tokenizer.decode(tokens, skip_special_tokens=skip)}
