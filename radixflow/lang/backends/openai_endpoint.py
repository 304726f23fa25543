"""Programs on any OpenAI-compatible server (gen; select through prompt logprobs).

Completion models get the program text as the prompt. Chat models (chat=True) get the
program's finished turns as messages: a gen must then sit at the start of an
assistant block. select needs a completions endpoint that returns prompt logprobs
(`echo` with `logprobs`); where that is not offered it raises an error saying so.
Text is re-tokenized by the server (no token ids are sent).
"""

from __future__ import annotations

from typing import Optional

from radixflow.errors import RadixflowError
from radixflow.lang.backends.base import Backend
from radixflow.lang.backends.http_util import check, client
from radixflow.lang.chat_template import ChatTemplate
from radixflow.lang.interpreter import GenResult, Prompt, SelectResult
from radixflow.runtime.programs.choice_scoring import choose, select_meta

_RENAME = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}


class OpenAIEndpoint(Backend):
    def __init__(self, base_url: str, model: str, api_key: Optional[str] = None, chat: bool = False, timeout: float = 600.0):
        self.base_url, self.model, self.chat = base_url.rstrip("/"), model, chat
        self.client = client(self.base_url, api_key, timeout)

    def chat_template(self) -> ChatTemplate:
        return ChatTemplate.messages_only() if self.chat else ChatTemplate.plain()

    def _body(self, params: dict) -> dict:
        body = {"model": self.model}
        for k, v in params.items():
            body[_RENAME.get(k, k)] = v
        return body

    def generate(self, prompt: Prompt, params: dict, node=None):
        if not self.chat:
            body = {**self._body(params), "prompt": prompt.text}
            out = check(self.client.post("/completions", json=body), "POST /completions").json()
            self.token_usage.add(out.get("usage"))
            return _results(out, lambda c: c["text"])
        if prompt.role is None or prompt.role[0] != "assistant" or prompt.role[1]:
            raise RadixflowError("with a chat model, a gen must come first in an assistant block")
        body = {**self._body(params), "messages": prompt.messages}
        out = check(self.client.post("/chat/completions", json=body), "POST /chat/completions").json()
        self.token_usage.add(out.get("usage"))
        return _results(out, lambda c: c["message"].get("content") or "")

    def select(self, prompt: Prompt, choices: list, method: str, node=None) -> SelectResult:
        if self.chat:
            raise RadixflowError("select needs prompt logprobs, which chat endpoints do not return; use a completion model")
        if method == "unconditional_likelihood_normalized":
            raise RadixflowError("unconditional_likelihood_normalized is not available on OpenAI-compatible endpoints")
        body = {"model": self.model, "prompt": [prompt.text + c for c in choices], "max_tokens": 0, "echo": True, "logprobs": 0}
        r = self.client.post("/completions", json=body)
        if r.status_code >= 400:
            raise RadixflowError(f"select needs prompt logprobs (echo + logprobs) from {self.base_url}: {r.text[:300]}")
        self.token_usage.add(r.json().get("usage"))
        by_index = sorted(r.json()["choices"], key=lambda c: c["index"])
        cond = [_choice_logprobs(c.get("logprobs"), len(prompt.text)) for c in by_index]
        best = choose(method, cond, None)
        return SelectResult(best, None, select_meta(cond, None))


def _results(out: dict, text_of):
    choices = sorted(out["choices"], key=lambda c: c["index"])
    results = [GenResult(text_of(c), None, {"finish_reason": c.get("finish_reason"), "usage": out.get("usage")}) for c in choices]
    return results[0] if len(results) == 1 else results


def _choice_logprobs(lp: Optional[dict], prefix_chars: int) -> list[float]:
    if not lp or lp.get("text_offset") is None or lp.get("token_logprobs") is None:
        raise RadixflowError("select needs prompt logprobs with text offsets (echo + logprobs); the server gave none")
    vals = [v for off, v in zip(lp["text_offset"], lp["token_logprobs"]) if off >= prefix_chars]
    return [0.0 if v is None else float(v) for v in vals]
