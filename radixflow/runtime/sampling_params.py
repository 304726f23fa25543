"""Sampling parameters with SGLang's names and defaults, validated once per request."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from radixflow.errors import RadixflowError

TOP_K_ALL = 1 << 30
GREEDY_EPS = 1e-6


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: Optional[Union[str, list]] = None
    stop_token_ids: Optional[list] = None
    stop_regex: Optional[Union[str, list]] = None  # accepted empty (SGLang's frontend always sends it)
    ignore_eos: bool = False
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    n: int = 1
    sampling_seed: Optional[int] = None
    regex: Optional[str] = None
    json_schema: Optional[Union[str, dict]] = None
    ebnf: Optional[str] = None
    logit_bias: Optional[dict] = None
    stream_interval: Optional[int] = None
    # filled by normalize()
    stop_strs: list = field(default_factory=list, repr=False)

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> "SamplingParams":
        if d is None:
            d = {}
        if isinstance(d, SamplingParams):
            return d
        if not isinstance(d, dict):
            raise RadixflowError(f"sampling_params must be an object (dict), got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)} - {"stop_strs"}
        unknown = sorted(set(d) - names)
        if unknown:
            raise RadixflowError(
                f"unknown sampling param(s): {', '.join(unknown)}; accepted: {', '.join(sorted(names))}"
            )
        p = cls(**d)
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
        for name in ("ignore_eos", "no_stop_trim", "skip_special_tokens", "spaces_between_special_tokens"):
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
        if self.stop_regex:
            raise RadixflowError("stop_regex is not supported yet; use stop strings (stop) instead")
        if self.stop_token_ids is not None:
            if not isinstance(self.stop_token_ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in self.stop_token_ids
            ):
                raise RadixflowError("stop_token_ids must be a list of integers")
        if isinstance(self.json_schema, dict):
            self.json_schema = json.dumps(self.json_schema)
        grammars = [g for g in ("regex", "json_schema", "ebnf") if getattr(self, g)]
        if len(grammars) > 1:
            raise RadixflowError(f"set at most one of regex / json_schema / ebnf, got {', '.join(grammars)}")
        if self.logit_bias is not None and not isinstance(self.logit_bias, dict):
            raise RadixflowError("logit_bias must be an object mapping token ids to biases")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPS or self.top_k == 1

    @property
    def grammar(self) -> Optional[tuple]:
        for kind in ("regex", "json_schema", "ebnf"):
            spec = getattr(self, kind)
            if spec:
                return (kind, spec)
        return None

    def copy(self, **changes: Any) -> "SamplingParams":
        return dataclasses.replace(self, **changes)


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
    if "" in stop:
        raise RadixflowError("stop strings must not be empty (an empty one would match at once); remove \"\"")
    return stop
