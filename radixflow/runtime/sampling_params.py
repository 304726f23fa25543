"""Sampling parameters with SGLang's names and defaults, validated once per request.

`SamplingParams` is the one table of sampling parameters: each field is a name with its default,
and says under which name the OpenAI API and the DSL's gen() take it (`api_names`), and whether
a program's run() may set it for all its gen calls. The Engine and the native API take the field
names themselves (`SamplingParams.from_dict`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from radixflow.errors import RadixflowError
from radixflow.runtime import sglang_fields
from radixflow.runtime.stop_regex import UNBOUNDED_WINDOW, StopPatterns, check_text, parse_stop_regex

TOP_K_ALL = 1 << 30
GREEDY_EPS = 1e-6


def _param(default: Any, openai: Optional[str] = "", gen: Optional[str] = None, run: bool = False) -> Any:
    """A sampling parameter: its default; its name in the OpenAI API ("": the same, None: not there) and
    as a gen() argument ("": the same, None: not one); `run`: a program's run() may set it for all gens."""
    return field(default=default, metadata={"openai": openai, "gen": gen, "run": run})


@dataclass
class SamplingParams:
    # OpenAI's max_tokens / max_completion_tokens are read by the OpenAI layer (they differ by route)
    max_new_tokens: int = _param(128, openai=None, gen="max_tokens", run=True)
    min_new_tokens: int = _param(0, openai="min_tokens", gen="min_tokens", run=True)
    temperature: float = _param(1.0, gen="", run=True)
    top_p: float = _param(1.0, gen="", run=True)
    top_k: int = _param(-1, gen="", run=True)
    min_p: float = _param(0.0, gen="", run=True)
    frequency_penalty: float = _param(0.0, gen="", run=True)
    presence_penalty: float = _param(0.0, gen="", run=True)
    repetition_penalty: float = _param(1.0, gen="", run=True)
    stop: Optional[Union[str, list]] = _param(None, gen="", run=True)
    stop_token_ids: Optional[list] = _param(None, gen="", run=True)
    stop_regex: Optional[Union[str, list]] = _param(None, gen="", run=True)  # runtime/stop_regex.py
    ignore_eos: bool = _param(False, gen="", run=True)
    no_stop_trim: bool = _param(False)
    skip_special_tokens: bool = _param(True)
    n: int = _param(1, gen="", run=True)
    sampling_seed: Optional[int] = _param(None, openai="seed")
    regex: Optional[str] = _param(None, gen="")
    json_schema: Optional[Union[str, dict]] = _param(None, gen="")
    ebnf: Optional[str] = _param(None)
    logit_bias: Optional[dict] = _param(None)
    # filled by normalize()
    stop_strs: list = field(default_factory=list, repr=False)
    stop_strs_bytes: int = field(default=0, repr=False)  # the longest stop string's UTF-8 bytes (the checked tail)
    stop_patterns: Optional[StopPatterns] = field(default=None, repr=False)

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> "SamplingParams":
        if d is None:
            d = {}
        if isinstance(d, SamplingParams):
            return d
        if not isinstance(d, dict):
            raise RadixflowError(f"sampling_params must be an object (dict), got {type(d).__name__}")
        names = set(SAMPLING_DEFAULTS)
        unknown = sorted(set(d) - names - set(sglang_fields.SAMPLING))
        if unknown:
            raise RadixflowError(
                f"unknown sampling param(s): {', '.join(unknown)}; accepted: {', '.join(sorted(names))}"
            )
        inert = {k: v for k, v in d.items() if k not in names}  # SGLang's, at values that change nothing
        sglang_fields.check_fields(inert, set(), sglang_fields.SAMPLING, "sampling_params")
        p = cls(**{k: v for k, v in d.items() if k in names})
        p.normalize()
        return p

    def normalize(self) -> None:
        _check_type("max_new_tokens", self.max_new_tokens, int)
        _check_type("min_new_tokens", self.min_new_tokens, int)
        _check_type("n", self.n, int)
        _check_type("top_k", self.top_k, int)
        for name in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"):
            _check_type(name, getattr(self, name), (int, float))
            setattr(self, name, float(getattr(self, name)))
        for name in ("ignore_eos", "no_stop_trim", "skip_special_tokens"):
            _check_type(name, getattr(self, name), bool)
        if self.max_new_tokens < 0:
            raise RadixflowError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.min_new_tokens < 0 or self.min_new_tokens > self.max_new_tokens:
            raise RadixflowError(f"min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}")
        if self.temperature < 0:
            raise RadixflowError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise RadixflowError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise RadixflowError(f"top_k must be -1 (all) or >= 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise RadixflowError(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise RadixflowError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise RadixflowError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        if self.n < 1:
            raise RadixflowError(f"n must be >= 1, got {self.n}")
        if self.sampling_seed is not None:
            _check_type("sampling_seed", self.sampling_seed, int)
        self.stop_strs = _normalize_stop(self.stop)
        self.stop_strs_bytes = max((len(t.encode()) for t in self.stop_strs), default=0)
        self.stop_patterns = parse_stop_regex(self.stop_regex)
        if self.stop_token_ids is not None:
            if not isinstance(self.stop_token_ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in self.stop_token_ids
            ):
                raise RadixflowError("stop_token_ids must be a list of integers")
        if isinstance(self.json_schema, dict):
            self.json_schema = json.dumps(self.json_schema)
        for name in ("regex", "json_schema", "ebnf"):  # "", false, 0 or [] turned the grammar off unseen
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                kind = "a non-empty string" + (" or a JSON schema object" if name == "json_schema" else "")
                raise RadixflowError(f"{name} must be {kind}, or null for no grammar; got {value!r}")
        grammars = [g for g in ("regex", "json_schema", "ebnf") if getattr(self, g)]
        if len(grammars) > 1:
            raise RadixflowError(f"set at most one of regex / json_schema / ebnf, got {', '.join(grammars)}")
        if self.logit_bias is not None and not isinstance(self.logit_bias, dict):
            raise RadixflowError("logit_bias must be an object mapping token ids to biases")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPS or self.top_k == 1

    @property
    def cut_strs(self) -> list:
        """What a finished output's text is cut at, so a stream holds back their beginnings: the stop strings
        and each stop_regex pattern's own text (its finish reason names the pattern, cut where it appears)."""
        if self.stop_patterns is None:  # the usual case: no new list (streams ask on every token)
            return self.stop_strs
        return self.stop_strs + [p.pattern for p in self.stop_patterns.patterns]

    @property
    def grammar(self) -> Optional[tuple]:
        for kind in ("regex", "json_schema", "ebnf"):
            spec = getattr(self, kind)
            if spec:
                return (kind, spec)
        return None

    def copy(self, **changes: Any) -> "SamplingParams":
        return dataclasses.replace(self, **changes)

    def sample(self, j: int) -> "SamplingParams":
        """Sample j of an n > 1 gen: n = 1, and a seeded gen's seed offset by j."""
        return self.copy(n=1, sampling_seed=None if self.sampling_seed is None else self.sampling_seed + j)


def params_key(raw: dict) -> Optional[str]:
    """A key that tells apart any two dicts that could parse differently (True from 1, 1 from 1.0,
    -0.0 from 0.0, a dict's order, which a schema's json.dumps keeps): the repr of one made only of
    plain types, whose repr is unambiguous; None for any other."""
    try:
        return repr(raw) if plain(raw) else None
    except RecursionError:  # nested past the interpreter's limit: not cached; the grammar check names the depth
        return None


_PLAIN = (str, int, float, bool, type(None))


def plain(v: Any) -> bool:
    """Plain data: its repr names it exactly (True is not 1, 1 is not 1.0, '1' is not 1)."""
    t = type(v)
    if t in _PLAIN:
        return True
    if t is dict:
        return all(type(k) is str and plain(x) for k, x in v.items())
    return t in (list, tuple) and all(plain(x) for x in v)


_FIELDS = [f for f in dataclasses.fields(SamplingParams) if f.name not in ("stop_strs", "stop_strs_bytes", "stop_patterns")]
SAMPLING_DEFAULTS: dict[str, Any] = {f.name: f.default for f in _FIELDS}
# what a program's run() may set for every gen call (SGLang's run(max_new_tokens=..., temperature=...))
RUN_SAMPLING_PARAMS: tuple[str, ...] = tuple(f.name for f in _FIELDS if f.metadata["run"])


def api_names(api: str) -> dict[str, str]:
    """{the name an API takes: the SamplingParams field} for api "openai" (request fields) or "gen"
    (the DSL's gen() arguments)."""
    names = {}
    for f in _FIELDS:
        alias = f.metadata[api]
        if alias is not None:
            names[alias or f.name] = f.name
    return names


def _check_type(name: str, value: Any, kind: Any) -> None:
    if isinstance(value, bool) and kind is not bool:
        raise RadixflowError(f"{name} must be a number, got a boolean")
    if not isinstance(value, kind):
        want = kind.__name__ if isinstance(kind, type) else "number"
        raise RadixflowError(f"{name} must be of type {want}, got {type(value).__name__}")


def _normalize_stop(stop: Any) -> list:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RadixflowError("stop must be a string or a list of strings")
    if len(stop) > 32:
        raise RadixflowError("at most 32 stop strings are allowed")
    for s in stop:
        check_text("stop string", s)
        if len(s) > UNBOUNDED_WINDOW:  # the longest text a stop check searches
            raise RadixflowError(f"a stop string may be at most {UNBOUNDED_WINDOW} characters, got {len(s)}")
    if "" in stop:
        raise RadixflowError("stop strings must not be empty (an empty one would match at once); remove \"\"")
    if any("\ufffd" in s for s in stop):  # it would match a character decoded before all of its bytes are out
        raise RadixflowError("stop strings must not contain U+FFFD, the replacement character a decode shows for "
                             "a character whose bytes are not all generated yet")
    return stop
