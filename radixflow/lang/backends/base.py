"""The backend interface programs run against, and the shared logic of backends that
speak radixflow's native generate API (Engine in-process, or a server over HTTP)."""

from __future__ import annotations

import threading
from typing import Callable, Iterator, Optional, Union

from radixflow.errors import RadixflowError
from radixflow.lang.chat_template import ChatTemplate
from radixflow.lang.interpreter import GenResult, Prompt, SelectResult
from radixflow.lang.primitives import logprob_options
from radixflow.runtime.programs.choice_scoring import choose, logprob_values, score_choices, select_meta
from radixflow.runtime.programs.segment_tokens import encode_piece, gen_piece


class TokenUsage:
    """SGLang's `backend.token_usage`: the prompt and completion tokens that the gens and
    selects run on this backend reported (each call's own figures; in a request graph each
    gen's, which counts its whole context as its prompt, as an eager call would)."""

    def __init__(self) -> None:
        self.prompt_tokens = self.completion_tokens = 0
        self._lock = threading.Lock()  # programs on many threads share a backend

    def add(self, meta: Optional[dict]) -> None:
        meta = meta or {}
        with self._lock:
            self.prompt_tokens += meta.get("prompt_tokens") or 0
            self.completion_tokens += meta.get("completion_tokens") or 0

    def reset(self) -> None:
        with self._lock:
            self.prompt_tokens = self.completion_tokens = 0

    def __repr__(self) -> str:
        return f"TokenUsage(prompt_tokens={self.prompt_tokens}, completion_tokens={self.completion_tokens})"


_USAGE_LOCK = threading.Lock()


class Backend:
    is_program_backend = True
    tokenizer = None  # the model's tokenizer, when this process can load it
    supports_graphs = False
    streams_graphs = False
    batches_threads = False  # calls from many threads at once are safe and share the model's batches

    @property
    def token_usage(self) -> TokenUsage:
        """Made on first use, so that a subclass need not call an __init__ of ours."""
        usage = self.__dict__.get("_token_usage")
        if usage is None:
            with _USAGE_LOCK:  # two threads asking first get the same one
                usage = self.__dict__.setdefault("_token_usage", TokenUsage())
        return usage

    @token_usage.setter
    def token_usage(self, usage: TokenUsage) -> None:
        self._token_usage = usage

    def chat_template(self) -> ChatTemplate:
        """The model's role markers, read off its tokenizer's chat template once: rendering the
        template takes milliseconds of Python, and a graph program asks twice (to lower, to replay)."""
        cached = getattr(self, "_chat_template", None)
        if cached is None or cached[0] is not self.tokenizer:
            cached = self._chat_template = (self.tokenizer, ChatTemplate.from_tokenizer(self.tokenizer))
        return cached[1]

    def generate(self, prompt: Prompt, params: dict, node=None) -> Union[GenResult, list]:
        raise NotImplementedError

    def generate_stream(self, prompt: Prompt, params: dict, node=None) -> Iterator[Union[tuple, GenResult]]:
        """(text so far, meta_info so far) while generating, then the GenResult."""
        yield self.generate(prompt, params, node)

    def select(self, prompt: Prompt, choices: list, method: str, node=None) -> SelectResult:
        raise NotImplementedError

    def run_graphs(self, programs: list, on_result: Optional[Callable[[int, dict], None]] = None) -> list:
        """Each program's output; one refused alone (its parameters, a prompt over the context) gives
        {"error": message} and the others run. Raises only where the whole call fails."""
        raise RadixflowError(f"{type(self).__name__} cannot run request graphs")

    def run_graph_stream(self, program: dict) -> Iterator[dict]:
        """{"var", "text"} deltas of the program's main strand, then its result."""
        raise RadixflowError(f"{type(self).__name__} cannot stream request graphs")

    def flush_cache(self) -> bool:
        return False

    def get_server_info(self) -> Optional[dict]:
        return None

    def cache_prefix(self, text: str) -> bool:
        """Prefill `text` so that later requests find it in the radix cache (SGLang's cache_prefix); False where
        the backend has no prefix cache (nothing is sent, as in SGLang)."""
        return False


class NativeBackend(Backend):
    """Generate and select through the native API's shape: `_call(payload)` and
    `_call_stream(payload)` are `Engine.generate` or `POST /generate`."""

    supports_graphs = True
    batches_threads = True  # an Engine's stepper, or a server's scheduler

    def _call(self, payload: dict):
        raise NotImplementedError

    def cache_prefix(self, text: str) -> bool:
        self._call({"text": text, "sampling_params": {"max_new_tokens": 0}})
        return True

    def _counted(self, payload: dict):
        """`_call`, adding what it reports to token_usage."""
        out = self._call(payload)
        for o in out if isinstance(out, list) else [out]:
            self.token_usage.add(o.get("meta_info"))
        return out

    def _call_stream(self, payload: dict) -> Iterator[dict]:
        raise NotImplementedError

    def _payload(self, prompt: Prompt, params: dict, node=None) -> dict:
        extra = {} if node is None else logprob_options(node.params)
        if prompt.ids is not None:
            return {"input_ids": prompt.ids, "sampling_params": params, **extra}
        return {"text": prompt.text, "sampling_params": params, **extra}

    def generate(self, prompt: Prompt, params: dict, node=None):
        out = self._counted(self._payload(prompt, params, node))
        if isinstance(out, list):
            return [self._gen_result(o, params) for o in out]
        return self._gen_result(out, params)

    def generate_stream(self, prompt: Prompt, params: dict, node=None):
        last = None
        for chunk in self._call_stream(self._payload(prompt, params, node)):
            last = chunk
            if chunk["meta_info"].get("finish_reason") is None:
                yield chunk["text"], chunk["meta_info"]
        if last is None:
            raise RadixflowError("the stream ended with no output")
        self.token_usage.add(last["meta_info"])
        yield self._gen_result(last, params)

    def _gen_result(self, out: dict, params: dict) -> GenResult:
        meta = out["meta_info"]
        if (meta.get("finish_reason") or {}).get("type") == "abort":
            raise RadixflowError(meta["finish_reason"].get("message", "the request was aborted"))
        if self.tokenizer is None:
            return GenResult(out["text"], None, meta)
        skip = params.get("skip_special_tokens", True)
        text, kept = gen_piece(self.tokenizer, out["output_ids"], meta.get("finish_reason"), skip, params.get("no_stop_trim", False))
        return GenResult(text, kept, meta)

    def select(self, prompt: Prompt, choices: list, method: str, node=None) -> SelectResult:
        if prompt.ids is None:
            return self._select_text(prompt, choices, method)
        cids = [encode_piece(self.tokenizer, c, first=False) for c in choices]
        inputs = [prompt.ids + c for c in cids]
        starts = [len(prompt.ids)] * len(cids)
        if method == "unconditional_likelihood_normalized":
            inputs += cids
            starts += [0] * len(cids)
        outs = self._score(inputs, starts)
        rows = [o["meta_info"]["input_token_logprobs"] for o in outs]
        best, meta = score_choices(method, rows[: len(cids)], rows[len(cids) :], cids)
        return SelectResult(best, cids[best], meta)

    def _score(self, inputs: list, starts: list) -> list:
        return self._counted(
            {
                "input_ids": inputs,
                "sampling_params": {"max_new_tokens": 0},
                "return_logprob": True,
                "logprob_start_len": starts,
            }
        )

    def _select_text(self, prompt: Prompt, choices: list, method: str) -> SelectResult:
        """Without a local tokenizer: score prompt+choice texts; the server's token count
        of the prompt alone marks where the choice starts (boundary tokens may merge)."""
        if method == "unconditional_likelihood_normalized":
            raise RadixflowError("unconditional_likelihood_normalized needs the model's tokenizer in this process")
        head = self._counted({"text": prompt.text, "sampling_params": {"max_new_tokens": 0}})
        start = head["meta_info"]["prompt_tokens"]
        outs = self._counted(
            {
                "text": [prompt.text + c for c in choices],
                "sampling_params": {"max_new_tokens": 0},
                "return_logprob": True,
                "logprob_start_len": start,
            }
        )
        cond = [logprob_values(o["meta_info"]["input_token_logprobs"]) for o in outs]
        best = choose(method, cond, None)
        return SelectResult(best, None, select_meta(cond, None))
