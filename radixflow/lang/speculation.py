"""API speculative execution (`@function(num_api_spec_tokens=N)`, as SGLang's frontend has it).

An eager program normally makes one backend call per gen, each sending the whole program so
far as its prompt. With speculation, a gen that ends at a stop string asks for at least N
tokens without its stops; the text past its stop is kept. The program's next constant text is
checked against it: when the model wrote exactly that text, the next gen with a stop is cut
from what follows, with no new call. On the first text the model did not write, the rest is
dropped and the next gen calls the backend again.

Only gens with stop strings are cut (the stop says where they end); the others, and gens with
stop_regex, n > 1, a grammar (regex, json_schema, dtype) or logprobs, call the backend as usual.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from radixflow.lang.primitives import LOGPROB_KEYS


@dataclass
class Speculation:
    tokens: int  # the least max_new_tokens of a speculative call
    text: str = ""  # what the last call wrote past the text used so far
    ended: bool = False  # that call stopped by itself (EOS), so nothing follows `text`

    def fill(self, text: str) -> None:
        """The program appends constant text: keep what follows it, if the model wrote it."""
        if self.text.startswith(text):
            self.text = self.text[len(text) :]
        else:
            self.drop()

    def drop(self) -> None:
        self.text, self.ended = "", False

    @staticmethod
    def applies(params: dict, gen_params: dict) -> bool:
        grammar = params.get("regex") or params.get("json_schema")
        logprobs = any(gen_params.get(k) for k in LOGPROB_KEYS)
        plain_stop = bool(params.get("stop")) and not params.get("stop_regex")
        return plain_stop and params.get("n", 1) == 1 and not grammar and not logprobs

    def take(self, params: dict, call: Callable[[dict], tuple], count: Optional[Callable[[str], int]]) -> Optional[tuple]:
        """(this gen's text, meta) cut from the speculation, calling the backend once if none is
        left (the meta is that call's, for the gen that made it), or None when the text cannot be
        known from it: the gen then calls the backend itself.
        `call(params)` -> (text, meta, stopped by itself); `count(text)`: its tokens, if known."""
        meta = {"speculative": True}
        if not self.text:
            spec = {**params, "max_new_tokens": max(params["max_new_tokens"], self.tokens), "stop": None}
            self.text, call_meta, self.ended = call({k: v for k, v in spec.items() if v is not None})
            meta.update(call_meta or {})
        stops = [params["stop"]] if isinstance(params["stop"], str) else list(params["stop"])
        found = [i for i in (self.text.find(s) for s in stops) if i >= 0]
        if found:
            end = min(found)
        elif self.ended:
            end = len(self.text)  # the model ended before any stop: so does this gen
        else:
            self.drop()  # the gen runs past what was speculated
            return None
        out = self.text[:end]
        if count is not None and count(out) > params["max_new_tokens"]:
            self.drop()  # longer than this gen may be: generate it for real
            return None
        self.text = self.text[end:]  # the stop string stays: the program's next text may start with it
        return out, meta
