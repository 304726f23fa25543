"""The program primitives: gen, gen_int, gen_string, select, and role blocks."""

from __future__ import annotations

import json
import re
from typing import Any, Optional, Union

from radixflow.errors import RadixflowError
from radixflow.lang.choices import ChoicesMethod, method_name
from radixflow.lang.ir import ExprList, Gen, RoleBegin, RoleEnd, Select, SeparateReasoning
from radixflow.runtime.sampling_params import api_names

_GEN_TO_SAMPLING = api_names("gen")  # gen() argument -> sampling param name (SGLang's frontend names)
LOGPROB_KEYS = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")  # per request, not sampling
_DTYPES = {int: "int", float: "float", str: "str", bool: "bool", "int": "int", "float": "float", "str": "str", "bool": "bool"}


def gen(
    name: Optional[str] = None,
    max_tokens: Optional[int] = None,
    min_tokens: Optional[int] = None,
    n: Optional[int] = None,
    stop: Optional[Union[str, list]] = None,
    stop_token_ids: Optional[list] = None,
    stop_regex: Optional[Union[str, list]] = None,
    temperature: Optional[float] = None,
    top_p: Optional[float] = None,
    top_k: Optional[int] = None,
    min_p: Optional[float] = None,
    frequency_penalty: Optional[float] = None,
    presence_penalty: Optional[float] = None,
    ignore_eos: Optional[bool] = None,
    return_logprob: Optional[bool] = None,
    logprob_start_len: Optional[int] = None,
    top_logprobs_num: Optional[int] = None,
    return_text_in_logprobs: Optional[bool] = None,
    dtype: Any = None,
    choices: Optional[list] = None,
    choices_method: Optional[ChoicesMethod] = None,
    regex: Optional[str] = None,
    json_schema: Optional[Union[str, dict]] = None,
    repetition_penalty: Optional[float] = None,
) -> Union[Gen, Select]:
    """Generate text into variable `name`. Unset (None) fields inherit the run()'s defaults."""
    if choices is not None:
        return select(name, choices, choices_method=choices_method)
    given = dict(locals())
    params = {_GEN_TO_SAMPLING[k]: v for k, v in given.items() if k in _GEN_TO_SAMPLING and v is not None}
    params.update({k: given[k] for k in LOGPROB_KEYS if given[k] is not None})
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as e:
            raise RadixflowError(f"gen {name!r}: invalid regex {regex!r}: {e}") from None
    if isinstance(json_schema, dict):
        params["json_schema"] = json.dumps(json_schema)
    if dtype is not None:
        if dtype not in _DTYPES:
            raise RadixflowError(f"gen {name!r}: dtype must be int, float, str or bool, got {dtype!r}")
        params["dtype"] = _DTYPES[dtype]
    return Gen(name=name, params=params)


def gen_int(name: Optional[str] = None, max_tokens: Optional[int] = None, **kwargs: Any) -> Gen:
    return gen(name, max_tokens=max_tokens, dtype=int, **kwargs)


def gen_string(name: Optional[str] = None, max_tokens: Optional[int] = None, **kwargs: Any) -> Gen:
    return gen(name, max_tokens=max_tokens, dtype=str, **kwargs)


def select(
    name: Optional[str] = None,
    choices: Optional[list] = None,
    temperature: float = 0.0,
    choices_method: Optional[ChoicesMethod] = None,
) -> Select:
    """Append the most likely of `choices` (all scored in one batch) and store it as `name`."""
    if isinstance(choices, str) or not choices or not all(isinstance(c, str) and c for c in choices):
        # a string is refused, not split into its characters
        raise RadixflowError(f"select {name!r}: choices must be a non-empty list of non-empty strings")
    return Select(name=name, choices=list(choices), method=method_name(choices_method), temperature=temperature)


def _role(role: str, expr: Any) -> ExprList:
    body = [] if expr is None else [expr]
    return ExprList([RoleBegin(role=role)] + body + [RoleEnd(role=role)])


def system(expr: Any = None) -> ExprList:
    return _role("system", expr)


def user(expr: Any = None) -> ExprList:
    return _role("user", expr)


def assistant(expr: Any = None) -> ExprList:
    return _role("assistant", expr)


def sampling_params(defaults: dict, params: dict) -> dict:
    """A gen's sampling params: the run's defaults, overridden by what the gen set."""
    out = {**defaults, **params}
    for k in ("dtype", *LOGPROB_KEYS):
        out.pop(k, None)
    dtype = params.get("dtype")
    if dtype is not None:
        out["regex"] = _dtype_regex(dtype)
        out.pop("json_schema", None)
        if dtype in ("int", "float"):  # as SGLang: the number may end at a space or newline, a stop
            out["regex"] += "[ \n]*"  # (trimmed); without it the stops could never match
            stops = out.get("stop") or []
            out["stop"] = ([stops] if isinstance(stops, str) else list(stops)) + [" ", "\n"]
    return out


def logprob_options(params: dict, defaults: Optional[dict] = None) -> dict:
    """A gen's logprob request fields (return_logprob, ...), as the generate API takes them: the gen's, else the
    run()'s (SGLang's run(return_logprob=...) sets them for every gen)."""
    merged = {**(defaults or {}), **params}
    return {k: merged[k] for k in LOGPROB_KEYS if merged.get(k) is not None}


def system_begin() -> RoleBegin:
    return RoleBegin(role="system")


def system_end() -> RoleEnd:
    return RoleEnd(role="system")


def user_begin() -> RoleBegin:
    return RoleBegin(role="user")


def user_end() -> RoleEnd:
    return RoleEnd(role="user")


def assistant_begin() -> RoleBegin:
    return RoleBegin(role="assistant")


def assistant_end() -> RoleEnd:
    return RoleEnd(role="assistant")


def image(expr: Any) -> None:
    raise RadixflowError("image() is not supported: radixflow serves text-only models")


def video(path: str, num_frames: int) -> None:
    raise RadixflowError("video() is not supported: radixflow serves text-only models")


def separate_reasoning(expr: Any = None, model_type: Optional[str] = None) -> ExprList:
    """`s += rf.separate_reasoning(rf.gen("answer"), model_type="deepseek-r1")`: after the gen, its
    thinking is in s["answer_reasoning_content"], and s["answer"] and the program's text hold the
    rest (as SGLang's; formats: runtime/reasoning.py). Every named gen / select in `expr` is split."""
    from radixflow.runtime.reasoning import NAMES, get_format

    if not model_type:
        raise RadixflowError(f"separate_reasoning() needs model_type, one of {', '.join(NAMES)}")
    get_format(model_type)
    if expr is None:
        return ExprList([])
    names = [n.name for n in _items(expr) if isinstance(n, (Gen, Select))]
    if not names or not all(names):
        raise RadixflowError('separate_reasoning() needs named gens or selects, e.g. separate_reasoning(gen("answer"), ...)')
    return ExprList([expr] + [SeparateReasoning(name=n, model_type=model_type.lower()) for n in names])


def _items(expr: Any) -> list:
    if isinstance(expr, ExprList):
        return [n for item in expr.items for n in _items(item)]
    return [expr]


def _dtype_regex(dtype: str) -> str:
    try:
        from radixflow.constrained import regex_for_dtype
    except ImportError:
        raise RadixflowError(
            "gen(dtype=...) needs radixflow.constrained.regex_for_dtype, which this build does not have yet"
        ) from None
    return regex_for_dtype(dtype)
