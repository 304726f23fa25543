"""The request-graph wire format (`POST /program`, `Engine.run_program`), validated.

    {"ops": [op, ...], "rid": optional str}
    {"op": "text", "text": str}                      constant text (roles already rendered)
    {"op": "var", "name": str}                       the value of an earlier gen/select
    {"op": "gen", "id": int, "name": str|null, "sampling_params": {...}}   n > 1: text and meta_info are lists
        optional: "return_logprob", "top_logprobs_num", "return_text_in_logprobs" (output logprobs,
        as /generate gives them; a graph gives no prompt logprobs)
    {"op": "select", "id": int, "name": str|null, "choices": [str, ...], "method": str}
    {"op": "fork", "id": int, "branches": [[op, ...], ...]}
    {"op": "join", "fork": int, "mode": "gather" | "concat"}

The reply: {"results": {"<id>": {"text", "meta_info"}}, "meta_info": {...}, "error": str|null}.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from radixflow.errors import RadixflowError
from radixflow.runtime.generate_request import logprob_options
from radixflow.runtime.programs.choice_scoring import METHODS
from radixflow.runtime.sampling_params import SamplingParams, params_key
from radixflow.runtime.scheduling.req import LogprobOptions

JOIN_MODES = ("gather", "concat")
PROGRAM_FIELDS = {"ops", "rid"}
OP_FIELDS = {
    "text": {"op", "text"},
    "var": {"op", "name"},
    "gen": {"op", "id", "name", "sampling_params", "return_logprob", "top_logprobs_num", "return_text_in_logprobs"},
    "select": {"op", "id", "name", "choices", "method"},
    "fork": {"op", "id", "branches"},
    "join": {"op", "fork", "mode"},
}


@dataclass
class Op:
    kind: str
    id: int = -1
    name: Optional[str] = None
    text: str = ""
    sampling: Optional[SamplingParams] = None
    logprob: Optional[LogprobOptions] = None  # a gen's output logprobs, if it asks for them
    choices: list = field(default_factory=list)
    method: str = "token_length_normalized"
    branches: list = field(default_factory=list)  # list[list[Op]]
    fork: int = -1
    mode: str = "gather"
    sampling_key: Optional[str] = None  # a gen's sampling_params as params_key gives them (None: not cached)


# how deep forks may nest: the program is walked (and sent between processes) recursively, and ~140 levels
# overflowed Python's stack while pickling (found by fuzzing: a 500, then a dropped connection)
MAX_FORK_DEPTH = 64


def parse_program(program: Any) -> list[Op]:
    """Validate a program dict and return its top-level ops. Raises RadixflowError."""
    if not isinstance(program, dict) or not isinstance(program.get("ops"), list):
        raise RadixflowError('a program must be an object with an "ops" list')
    _check_keys(program, PROGRAM_FIELDS, "a program")
    if program.get("rid") is not None and not isinstance(program["rid"], str):
        raise RadixflowError("a program's rid must be a string")
    ops = _parse_ops(program["ops"], set())
    if not any(o.kind in ("gen", "select", "fork") for o in _walk(ops)):
        raise RadixflowError("the program has no gen, select or fork; use /generate for plain text")
    return ops


def program_width(ops: list[Op]) -> int:
    """The most scheduler requests the program can have at once: one per strand (the
    main one and every fork branch), a select's scoring requests and a gen's n samples
    counted in full."""
    scoring = [len(o.choices) * (2 if o.method == "unconditional_likelihood_normalized" else 1) for o in ops if o.kind == "select"]
    own = max([1, *scoring, *(o.sampling.n for o in ops if o.kind == "gen")])
    return own + sum(program_width(b) for o in ops if o.kind == "fork" for b in o.branches)


def gen_ops(ops: list[Op]) -> list[Op]:
    return [o for o in _walk(ops) if o.kind == "gen"]


def _gen_logprob(r: dict, name: Optional[str]) -> Optional[LogprobOptions]:
    if "return_logprob" not in r and "top_logprobs_num" not in r and "return_text_in_logprobs" not in r:
        return None  # the defaults: valid, and no logprobs
    text = r.get("return_text_in_logprobs", False)
    try:
        if not isinstance(text, bool):
            raise RadixflowError("return_text_in_logprobs must be true or false")
        lp = logprob_options(r.get("return_logprob", False), -1, r.get("top_logprobs_num", 0), text, 1)
    except RadixflowError as e:
        raise RadixflowError(f"gen {name!r}: {e}") from None
    return lp if lp.return_logprob else None


def _check_keys(r: dict, allowed: set, what: str) -> None:
    unknown = sorted(set(r) - allowed)
    if unknown:
        raise RadixflowError(f"unknown field(s) in {what}: {', '.join(unknown)}; accepted: {', '.join(sorted(allowed))}")


def _walk(ops: list[Op]):
    for o in ops:
        yield o
        for b in o.branches:
            yield from _walk(b)


def _parse_ops(raw: list, ids: set, depth: int = 0) -> list[Op]:
    if depth > MAX_FORK_DEPTH:
        raise RadixflowError(f"forks nest more than {MAX_FORK_DEPTH} deep; flatten the program (a fork's branches "
                             "may hold forks, up to that depth)")
    out = []
    forks, joined = set(), set()
    for i, r in enumerate(raw):
        if not isinstance(r, dict):
            raise RadixflowError(f"op {i} must be an object")
        op = _parse_op(r, ids, depth)
        if op.kind == "fork":
            forks.add(op.id)
        if op.kind == "join" and op.fork not in forks:
            raise RadixflowError(f"join of fork {op.fork} comes before that fork (or in another branch)")
        if op.kind == "join" and op.fork in joined:  # concat would append the branches' text twice
            raise RadixflowError(f"fork {op.fork} is joined twice; join each fork once")
        joined.update([op.fork] if op.kind == "join" else [])
        out.append(op)
    return out


def _parse_op(r: dict, ids: set, depth: int) -> Op:
    kind = r.get("op")
    if kind in OP_FIELDS:
        _check_keys(r, OP_FIELDS[kind], f"a {kind} op")
    if kind == "text":
        return Op("text", text=_str(r, "text"))
    if kind == "var":
        return Op("var", name=_str(r, "name"))
    if kind == "join":
        mode = r.get("mode", "gather")
        if mode not in JOIN_MODES:
            raise RadixflowError(f"join mode must be one of {', '.join(JOIN_MODES)}, got {mode!r}")
        return Op("join", fork=_int(r, "fork"), mode=mode)
    if kind not in ("gen", "select", "fork"):
        raise RadixflowError(f"unknown op {kind!r}; use text, var, gen, select, fork or join")
    op = Op(kind, id=_int(r, "id"), name=r.get("name"))
    if op.id in ids:
        raise RadixflowError(f"op id {op.id} is used twice")
    ids.add(op.id)
    if op.name is not None and not isinstance(op.name, str):
        raise RadixflowError(f"op {op.id}: name must be a string")
    if kind == "gen":
        try:
            op.sampling, op.sampling_key = _sampling(r.get("sampling_params"))
        except RadixflowError as e:
            raise RadixflowError(f"gen {op.name!r}: {e}") from None
        op.logprob = _gen_logprob(r, op.name)
    elif kind == "select":
        _select_fields(op, r)
    else:
        branches = r.get("branches")
        if not isinstance(branches, list) or not branches or not all(isinstance(b, list) for b in branches):
            raise RadixflowError(f"fork {op.id}: branches must be a non-empty list of op lists")
        op.branches = [_parse_ops(b, ids, depth + 1) for b in branches]
    return op


def _select_fields(op: Op, r: dict) -> None:
    choices = r.get("choices")
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise RadixflowError(f"select {op.name!r}: choices must be a non-empty list of non-empty strings")
    method = r.get("method", "token_length_normalized")
    if method not in METHODS:
        raise RadixflowError(f"select {op.name!r}: method must be one of {', '.join(METHODS)}")
    op.choices, op.method = choices, method


def _str(r: dict, key: str) -> str:
    v = r.get(key)
    if not isinstance(v, str):
        raise RadixflowError(f"{r.get('op')} op: {key} must be a string")
    return v


def _int(r: dict, key: str) -> int:
    v = r.get(key)
    if not isinstance(v, int) or isinstance(v, bool):
        raise RadixflowError(f"{r.get('op')} op: {key} must be an integer")
    return v


def check_programs(
    programs: list, check_sampling: Callable[..., SamplingParams], max_requests: Optional[int]
) -> list[list[Op]]:
    """Everything known before running, as for /generate: each program's shape, each gen's
    sampling params against the model (`check_sampling`: a RequestBuilder's `sampling`, which
    checks each content key once), and the requests the whole call may run at once against the
    server's per-call limit (None: no limit, as in Engine). Returns each program's parsed ops;
    raises RadixflowError."""
    total = 0
    parsed = []
    for program in programs:
        ops = parse_program(program)
        parsed.append(ops)
        for op in gen_ops(ops):
            try:
                op.sampling = check_sampling(op.sampling, key=op.sampling_key)
            except RadixflowError as e:
                raise RadixflowError(f"gen {op.name!r}: {e}") from None
        total += program_width(ops)
    if max_requests is not None and total > max_requests:
        raise RadixflowError(
            f"the call may run {total} requests at once (programs x fork branches x select choices); "
            f"this server accepts at most {max_requests} per call (--max-batch-size)"
        )
    return parsed


# -- gens' sampling params, parsed once per distinct dict ----------------------------------------
# A batch of programs repeats the same few sampling_params dicts (one per gen of the program);
# parsing each again held the GIL for most of a program's check. Gens with the same dict share one
# SamplingParams, as a strand's requests already do (nothing writes to it). The checks against the
# model are the RequestBuilder's, cached there by the same key (generate_request.RequestBuilder.sampling).
_CACHE_MAX = 4096
_PARSED: dict = {}  # params_key(sampling_params) -> SamplingParams


def _sampling(raw: Any) -> tuple[SamplingParams, Optional[str]]:
    if raw is not None and not isinstance(raw, dict):
        raise RadixflowError(f"a gen's sampling_params must be an object, got {type(raw).__name__}")
    key = params_key(raw) if type(raw) is dict else None
    sp = None if key is None else _PARSED.get(key)
    if sp is None:  # a cached one holds copies: the caller's lists may change after
        sp = SamplingParams.from_dict(dict(raw or {}) if key is None else copy.deepcopy(raw))
        if key is not None:
            if len(_PARSED) >= _CACHE_MAX:
                _PARSED.clear()
            _PARSED[key] = sp
    return sp, key


def joined_names(parent_vars, kids: list) -> list[tuple]:
    """The variables a join gathers, as SGLang's join does, each with the branches that set it: those the branches
    (`kids`, each with `produced`, the names it set) set that the parent did not have when it joined. Each becomes
    the list of those branches' values; a variable the parent had keeps the parent's value. Used by the executor,
    the eager interpreter and the tracer alike."""
    names = [n for n in dict.fromkeys(n for k in kids for n in k.produced) if n not in parent_vars]
    return [(n, [k for k in kids if n in k.produced]) for n in names]

