"""Turns a generate call (single or batch, text or token ids) into validated requests,
and finished requests back into SGLang-shaped result dicts. Shared by Engine and the
HTTP server, so both validate and answer alike."""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass
from typing import Any, Optional

from radixflow.errors import RadixflowError
from radixflow.runtime.programs.piece_codec import piece_decoder
from radixflow.runtime.scheduling.req import LogprobOptions, Req, ReqOutput, max_request_tokens, over_limit
from radixflow.runtime.sampling_params import SamplingParams, params_key

CHECKED_MAX = 4096  # distinct sampling_params dicts a builder keeps parsed and checked
MAX_ASKED_IDS = 1000  # token_ids_logprob's ids a request may ask for (top_logprobs_num's bound too)


@dataclass
class GenerateInput:
    """One generate call, as the user gave it (SGLang's GenerateReqInput, reduced)."""

    text: Any = None
    input_ids: Any = None
    sampling_params: Any = None
    rid: Any = None
    return_logprob: Any = False
    logprob_start_len: Any = None
    top_logprobs_num: Any = 0
    return_text_in_logprobs: bool = False
    stream: bool = False
    token_ids_logprob: Any = None  # token ids (a list for every prompt, or one list per prompt)

    @property
    def is_batch(self) -> bool:
        if self.text is not None:
            return isinstance(self.text, list)
        return bool(self.input_ids) and isinstance(self.input_ids[0], list)


class RequestBuilder:
    """Validates and tokenizes generate calls for one model."""

    def __init__(self, tokenizer, vocab_size: int, context_len: int, max_pool_tokens: int, max_new_tokens_limit: int = 1 << 20, grammar_backend: str = "llguidance"):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.context_len = context_len
        self.max_pool_tokens = max_pool_tokens
        self.max_new_tokens_limit = max_new_tokens_limit
        self.grammar_backend = grammar_backend
        self.max_requests: Optional[int] = None  # a server's --max-batch-size: checked before any prompt is tokenized
        self._checked: dict = {}  # params_key(sampling_params) -> the SamplingParams that passed sampling()

    def build(self, g: GenerateInput) -> list[Req]:
        """Requests in output order (prompt-major when n > 1). Raises RadixflowError."""
        prompts = self._prompts(g)
        count = len(prompts)
        params = _per_item(g.sampling_params, count, "sampling_params")
        rids = _rids(g.rid, count)
        want_lp = _per_item(g.return_logprob, count, "return_logprob")
        start = _per_item(g.logprob_start_len, count, "logprob_start_len")
        topk = _per_item(g.top_logprobs_num, count, "top_logprobs_num")
        asked = _asked_ids(g.token_ids_logprob, count, self.vocab_size)
        sps = [self.sampling(p) for p in params]
        self._check_count(sum(sp.n for sp in sps))  # before a request is made for each of n samples
        reqs = []
        for i, ids in enumerate(prompts):
            sp = _fit_context(sps[i], max_request_tokens(self.context_len, self.max_pool_tokens) - len(ids))
            lp = logprob_options(want_lp[i], start[i], topk[i], g.return_text_in_logprobs, len(ids), asked[i])
            for j in range(sp.n):
                sub = sp if sp.n == 1 else sp.sample(j)
                rid = rids[i] if sp.n == 1 else f"{rids[i]}-{j}"
                reqs.append(Req(rid=rid, origin_input_ids=list(ids), sampling=sub, logprob=lp, streamed=bool(g.stream)))
        return reqs

    def sampling(self, params: Any, key: Optional[str] = None) -> SamplingParams:
        """Sampling params checked against this model and server (also for request graphs' gens).
        A plain dict is parsed and checked once per content: an eager program's gens send the same
        few dicts on every call, and the requests made from one dict share its SamplingParams (as a
        request graph's gens do: nothing writes to it). A request graph's gen passes its params
        already parsed, with the content `key` of the dict they came from (program_ops)."""
        if key is None and type(params) is dict:
            key = params_key(params)
        sp = None if key is None else self._checked.get(key)
        if sp is not None:
            return sp
        if type(params) is dict and key is not None:
            params = copy.deepcopy(params)  # the cached one must not see the caller's later changes
        sp = self._check(SamplingParams.from_dict(params))
        if key is not None:
            if len(self._checked) >= CHECKED_MAX:
                self._checked.clear()
            self._checked[key] = sp  # only once the checks passed
        return sp

    def _check(self, sp: SamplingParams) -> SamplingParams:
        if sp.grammar is not None:
            if self.grammar_backend == "none":
                raise grammars_off(sp.grammar[0])
            from radixflow.constrained import validate  # grammar backends only when grammars are used

            validate(*sp.grammar, backend=self.grammar_backend)
        _check_logit_bias(sp.logit_bias, self.vocab_size)
        bad = [t for t in sp.stop_token_ids or [] if not 0 <= t < self.vocab_size]
        if bad:
            raise RadixflowError(f"stop_token_ids {bad} are not token ids in [0, {self.vocab_size})")
        limit = self.max_new_tokens_limit
        # the default's value is taken for the default, not the caller's (it was a 400: fuzzing), sent or not: a
        # program's gen sends it when it names none, and an explicit 128 over the limit is cut, not refused
        if sp.max_new_tokens > limit and sp.max_new_tokens == DEFAULT_MAX_NEW_TOKENS:
            return _fit_context(sp, limit)
        if sp.max_new_tokens > limit:
            raise RadixflowError(f"max_new_tokens={sp.max_new_tokens} is over this server's limit of {limit}")
        return sp

    def _check_count(self, requests: int) -> None:
        if self.max_requests is not None and requests > self.max_requests:
            raise RadixflowError(f"the call makes {requests} requests (prompts x n); this server accepts at most "
                                 f"{self.max_requests} (--max-batch-size)")

    def _prompts(self, g: GenerateInput) -> list[list[int]]:
        if (g.text is None) == (g.input_ids is None):
            raise RadixflowError("give exactly one of text (prompt) or input_ids")
        if g.text is not None:
            texts = g.text if isinstance(g.text, list) else [g.text]
            if not texts:
                raise RadixflowError("the batch of prompts is empty")
            self._check_count(len(texts))
            for t in texts:
                if not isinstance(t, str):
                    raise RadixflowError(f"each prompt must be a string, got {type(t).__name__}")
                if not t:
                    raise RadixflowError("a prompt is empty; give at least one character")
            try:
                batch = [self.tokenizer.encode(t) for t in texts]
            except TypeError:  # tokenizers' complaint about a lone surrogate ('\udcff'), the only non-text a str holds
                raise RadixflowError("a prompt holds a lone surrogate (such as '\\udcff'), which is not text; remove it") from None
        else:
            batch = g.input_ids if g.is_batch else [g.input_ids]
            if not batch:
                raise RadixflowError("input_ids is empty")
            self._check_count(len(batch))
        for ids in batch:
            self._check_ids(ids)
        return batch

    def _check_ids(self, ids: Any) -> None:
        if not isinstance(ids, list) or not ids:
            raise RadixflowError("input_ids must be a non-empty list of token ids")
        if not token_ids_in(ids, self.vocab_size):
            raise RadixflowError(f"input_ids must be integers in [0, {self.vocab_size})")
        limit = over_limit(len(ids), self.context_len, self.max_pool_tokens)
        if limit:
            raise RadixflowError(f"the prompt has {len(ids)} tokens but {limit}; shorten the prompt")


DEFAULT_MAX_NEW_TOKENS = SamplingParams().max_new_tokens


def _fit_context(sp: SamplingParams, room: int) -> SamplingParams:
    """`sp` with max_new_tokens cut to the `room` the context length (or the KV pool: req.max_request_tokens) leaves
    after the prompt: the output ends there anyway, and a grammar's budget must close it within that room, not within
    max_new_tokens."""
    if sp.max_new_tokens <= room:
        return sp
    return sp.copy(max_new_tokens=room, min_new_tokens=min(sp.min_new_tokens, room))


def token_ids_in(ids: list, vocab_size: int) -> bool:
    """Whether every entry is an int (not a bool) in [0, vocab_size). Plain ints, the usual case, are
    checked in C (type set, min, max): a Python test per token cost eager programs ~1 us a prompt
    token on every call. Other types (int subclasses are allowed) take the per-item test."""
    if set(map(type, ids)) == {int}:
        return min(ids) >= 0 and max(ids) < vocab_size
    return all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in ids)


LOGIT_BIAS_RANGE = 100  # OpenAI's: -100 bans a token, 100 all but forces it


def _check_logit_bias(bias: Any, vocab_size: int) -> None:
    """Keys are token ids (ints or ASCII digit strings, as JSON forces) in the vocabulary; values within OpenAI's
    [-100, 100]: beyond float32's range a value became inf, and inf plus a ban (-inf) is NaN, which let a token
    that min_new_tokens or a grammar had banned through."""
    for k, v in (bias or {}).items():
        digits = isinstance(k, str) and k.isascii() and k.isdigit()
        tid = k if isinstance(k, int) and not isinstance(k, bool) else (int(k) if digits else -1)
        if not 0 <= tid < vocab_size:
            raise RadixflowError(f"logit_bias key {k!r} is not a token id in [0, {vocab_size})")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RadixflowError(f"logit_bias[{k!r}] must be a number, got {type(v).__name__}")
        if not -LOGIT_BIAS_RANGE <= v <= LOGIT_BIAS_RANGE:  # NaN fails too
            raise RadixflowError(f"logit_bias[{k!r}] = {v} is outside [-{LOGIT_BIAS_RANGE}, {LOGIT_BIAS_RANGE}] "
                                 "(-100 bans the token, 100 all but forces it)")


def _per_item(value: Any, count: int, name: str) -> list:
    if isinstance(value, list):
        if len(value) != count:
            raise RadixflowError(f"{name} has {len(value)} entries for {count} prompts")
        return value
    return [value] * count


def _rids(rid: Any, count: int) -> list[str]:
    if rid is None:
        return [uuid.uuid4().hex for _ in range(count)]
    if isinstance(rid, str):
        return [rid] if count == 1 else [f"{rid}_{i}" for i in range(count)]
    if isinstance(rid, list) and len(rid) == count and all(isinstance(r, str) for r in rid):
        if len(set(rid)) < len(rid):  # the results would be told apart by position only, an abort would hit one
            raise RadixflowError("rid has the same rid twice; give each prompt its own")
        return rid
    raise RadixflowError("rid must be a string or a list of strings, one per prompt")


def grammars_off(field: str) -> RadixflowError:
    """The refusal of a grammar under --grammar-backend none, naming the request's `field` that asked for one."""
    return RadixflowError(f"this server takes no grammars (--grammar-backend none): send the request without {field}, "
                          "or start the server with another --grammar-backend")


def _asked_ids(value: Any, count: int, vocab_size: int) -> list:
    """token_ids_logprob per prompt, as SGLang takes it: one list of ids for every prompt, or a list (or null) per
    prompt; each a tuple of ids in the vocabulary, or None."""
    if value is None:
        return [None] * count
    if not isinstance(value, list):
        raise RadixflowError("token_ids_logprob must be a list of token ids, or one such list (or null) per prompt")
    per_prompt = bool(value) and all(v is None or isinstance(v, list) for v in value)
    lists = _per_item(value, count, "token_ids_logprob") if per_prompt else [value] * count
    return [_checked_ids(ids, vocab_size) for ids in lists]


def _checked_ids(ids: Optional[list], vocab_size: int) -> Optional[tuple]:
    if not ids:
        return None
    if len(ids) > MAX_ASKED_IDS or not token_ids_in(ids, vocab_size):
        raise RadixflowError(f"token_ids_logprob must hold at most {MAX_ASKED_IDS} token ids in [0, {vocab_size})")
    return tuple(ids)


def logprob_options(want: Any, start: Any, topk: Any, text: bool, prompt_len: int,
                    asked: Optional[tuple] = None) -> LogprobOptions:
    if not isinstance(want, bool):
        raise RadixflowError("return_logprob must be true or false")
    if start is None:
        start = -1
    if not isinstance(start, int) or isinstance(start, bool) or start < -1:
        raise RadixflowError("logprob_start_len must be an integer >= -1")
    if not isinstance(topk, int) or isinstance(topk, bool) or not 0 <= topk <= 1000:
        raise RadixflowError("top_logprobs_num must be an integer in [0, 1000]")
    return LogprobOptions(want, min(start, prompt_len - 1) if start >= 0 else -1, topk if want else 0, text,
                          asked if want else None)


def output_text(tokenizer, ids: list, reason: Any, skip_special_tokens: bool, no_stop_trim: bool) -> str:
    """A whole output's text, with a matched stop token or stop string cut off
    (shared with the server's detokenizer, so both give the same text)."""
    text_ids = ids
    if reason and isinstance(reason.get("matched"), int) and ids and ids[-1] == reason["matched"] and not no_stop_trim:
        text_ids = ids[:-1]
    text = piece_decoder(tokenizer)(text_ids, skip_special_tokens)
    if reason and isinstance(reason.get("matched"), str) and not no_stop_trim:
        cut = text.find(reason["matched"])
        if cut >= 0:
            text = text[:cut]
    return text


def build_result(out: ReqOutput, text: str, logprob: LogprobOptions, finished: bool, e2e_latency: float) -> dict:
    """SGLang's response shape {text, output_ids, meta_info} for a request's output so far: the one
    place the Engine and the server's tokenizer manager build results. `out`'s logprob lists hold SGLang's
    triples (output_delta.Assembly's), copied here as a later report extends them."""
    meta = {
        "id": out.rid,
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": len(out.output_ids),
        "cached_tokens": out.cached_tokens,
        "finish_reason": out.finish_reason if finished else None,
        "num_retractions": out.num_retractions,
    }
    if finished:
        meta["e2e_latency"] = e2e_latency
    if out.jump_forward_tokens:
        meta["jump_forward_tokens"] = out.jump_forward_tokens
    if logprob.return_logprob:
        meta["input_token_logprobs"] = list(out.input_token_logprobs or [])
        meta["output_token_logprobs"] = list(out.new_output_token_logprobs)
        meta["output_token_logprobs_length"] = len(out.new_output_token_logprobs)
        if logprob.top_logprobs_num:  # each entry a finished list of triples
            meta["input_top_logprobs"] = list(out.input_top_logprobs or [])
            meta["output_top_logprobs"] = list(out.new_output_top_logprobs)
        if logprob.token_ids_logprob:  # the same, for the asked token ids in their order
            meta["input_token_ids_logprobs"] = list(out.input_token_ids_logprobs or [])
            meta["output_token_ids_logprobs"] = list(out.new_output_token_ids_logprobs)
    return {"text": text, "output_ids": list(out.output_ids), "meta_info": meta}

