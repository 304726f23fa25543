"""Constrained decoding end to end with the default model, on the outlines grammar backend
(the one with budget-aware completion; the llguidance default is in test_grammar_backends.py): every output of the schema and
regex corpus validates, greedy and at temperature 1.0; unconstrained neighbours are
unaffected; jump-forward saves forward passes; tight budgets still give valid JSON;
bad grammars fail up front and the engine keeps working."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re

import pytest
from jsonschema import Draft202012Validator

from constrained_corpus import REGEXES, SCHEMAS
from radixflow.constrained import regex_for_choices, regex_for_dtype
from radixflow.constrained.backend import GrammarBackend
from radixflow.errors import RadixflowError
from radixflow.runtime.scheduling.grammar_wait import start_grammar_backend

SCHEMA_TOKENS = 72  # the corpus needs at most 35 (budget-aware completion closes in time)
REGEX_TOKENS = 32
UNBOUNDED = [
    {"type": "object", "properties": {"name": {"type": "string"}, "bio": {"type": "string"}}, "required": ["name", "bio"]},
    {"type": "object", "properties": {"title": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["title", "tags"]},
    {"type": "object", "properties": {"notes": {"type": "array", "items": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}, "required": ["notes"]},
]


@pytest.fixture(scope="module")
def engine(engine):
    """The session's engine with its grammars on the outlines backend for this module."""
    sched = engine.scheduler
    saved = (sched.grammar_backend, sched.jump_forward, engine.builder.grammar_backend)
    args = dataclasses.replace(sched.args, grammar_backend="outlines")
    sched.grammar_backend = GrammarBackend(engine.tokenizer, engine.runner.vocab_size, engine.eos_ids, args)
    sched.jump_forward = None if args.disable_jump_forward else sched.grammar_backend.jump_forward
    engine.builder.grammar_backend = "outlines"
    yield engine
    sched.grammar_backend.cache.pool.shutdown(wait=False)
    sched.grammar_backend, sched.jump_forward, engine.builder.grammar_backend = saved


def schema_prompt(schema: dict) -> str:
    fields = ", ".join(schema.get("properties", {})) or schema.get("type", "value")
    return f"Write a realistic JSON example with {fields}:\n"


def regex_prompt(name: str) -> str:
    return f"Give an example of a {name.replace('_', ' ')}:"


def assert_valid_json(out: dict, schema: dict, budget: int) -> None:
    meta = out["meta_info"]
    assert meta["finish_reason"]["type"] in ("stop", "length"), meta["finish_reason"]
    assert meta["completion_tokens"] <= budget
    value = json.loads(out["text"])
    checker = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    errors = [e.message for e in checker.iter_errors(value)]
    assert not errors, (out["text"], errors)


@contextlib.contextmanager
def jump_forward(engine, on: bool):
    sched = engine.scheduler
    backend = start_grammar_backend(sched)
    saved = (sched.jump_forward, backend.jump_enabled)
    sched.jump_forward, backend.jump_enabled = (backend.jump_forward if on else None), on
    try:
        yield
    finally:
        sched.jump_forward, backend.jump_enabled = saved


@contextlib.contextmanager
def count_forward_passes(engine):
    runner = engine.runner
    inner = runner.forward
    calls = {"n": 0}

    def counted(fb):
        calls["n"] += 1
        return inner(fb)

    runner.forward = counted
    try:
        yield calls
    finally:
        del runner.forward


def test_corpus_outputs_all_validate_greedy_and_sampled(engine):
    """All schemas and regexes, greedy and at temperature 1.0, in one batched call."""
    prompts, params, expect = [], [], []
    for temperature in (0.0, 1.0):
        for i, schema in enumerate(SCHEMAS):
            prompts.append(schema_prompt(schema))
            params.append({"json_schema": schema, "max_new_tokens": SCHEMA_TOKENS, "temperature": temperature, "sampling_seed": i})
            expect.append(("json", schema))
        for i, (name, rx) in enumerate(REGEXES):
            prompts.append(regex_prompt(name))
            params.append({"regex": rx, "max_new_tokens": REGEX_TOKENS, "temperature": temperature, "sampling_seed": i})
            expect.append(("regex", rx))
    outs = engine.generate(prompts, params)
    for (kind, spec), out in zip(expect, outs):
        if kind == "json":
            assert_valid_json(out, spec, SCHEMA_TOKENS)
        else:
            assert out["meta_info"]["completion_tokens"] <= REGEX_TOKENS
            assert re.fullmatch(spec, out["text"]), (spec, out["text"])
    stopped = sum(o["meta_info"]["finish_reason"]["type"] == "stop" for o in outs)
    assert stopped >= len(outs) * 0.7, f"only {stopped}/{len(outs)} ended by the grammar"


def test_unconstrained_requests_unaffected_by_constrained_neighbours(engine):
    plain = ["The capital of France is", "List three colors:", "def add(a, b):"]
    greedy = {"max_new_tokens": 16, "temperature": 0}
    alone = [o["text"] for o in engine.generate(plain, greedy)]
    mixed_prompts = plain + [schema_prompt(s) for s in SCHEMAS[:3]] + ["Pick a color:"]
    mixed_params = [greedy] * 3 + [{**greedy, "max_new_tokens": 64, "json_schema": s} for s in SCHEMAS[:3]]
    mixed_params += [{**greedy, "regex": regex_for_choices(["red", "green", "blue"])}]
    mixed = engine.generate(mixed_prompts, mixed_params)
    assert [o["text"] for o in mixed[:3]] == alone
    for s, o in zip(SCHEMAS[:3], mixed[3:6]):
        assert_valid_json(o, s, 64)
    assert mixed[6]["text"] in ("red", "green", "blue")


def test_jump_forward_saves_forward_passes(engine, capsys):
    schemas = [SCHEMAS[i] for i in (1, 5, 6, 13, 21, 26)]
    prompts = [schema_prompt(s) for s in schemas]
    params = [{"json_schema": s, "max_new_tokens": 72, "temperature": 0} for s in schemas]
    passes, jumped = {}, {}
    for on in (False, True):
        with jump_forward(engine, on), count_forward_passes(engine) as calls:
            outs = engine.generate(prompts, params)
        passes[on] = calls["n"]
        jumped[on] = sum(o["meta_info"].get("jump_forward_tokens", 0) for o in outs)
        for s, o in zip(schemas, outs):
            assert_valid_json(o, s, 72)
    with capsys.disabled():
        print(f"\njump-forward: forward passes off={passes[False]} on={passes[True]}; tokens jumped on={jumped[True]}")
    assert jumped[False] == 0 and jumped[True] > 0
    assert passes[True] < passes[False]


def test_tight_budgets_still_give_valid_json(engine):
    prompts, params, cases = [], [], []
    for i in range(12):
        schema = UNBOUNDED[i % len(UNBOUNDED)]
        budget = 24 + 2 * i  # 24 .. 46
        prompts.append("Write a long, detailed JSON record about a famous novelist:")
        params.append({"json_schema": schema, "max_new_tokens": budget, "temperature": 1.0, "sampling_seed": 100 + i})
        cases.append((schema, budget))
    outs = engine.generate(prompts, params)
    for (schema, budget), out in zip(cases, outs):
        assert_valid_json(out, schema, budget)
    at_limit = sum(o["meta_info"]["completion_tokens"] >= b - 2 for o, (_, b) in zip(outs, cases))
    assert at_limit >= 3, "the budgets should bind for several requests (else this tests nothing)"


def test_choices_and_dtypes_through_the_engine(engine):
    outs = engine.generate(
        ["Is the sky blue? Answer:", "How many legs does a cat have?", "Pi is roughly", "Is water wet?"],
        [
            {"regex": regex_for_choices(["yes", "no"]), "temperature": 0},
            {"regex": regex_for_dtype(int), "temperature": 0, "max_new_tokens": 8},
            {"regex": regex_for_dtype(float), "temperature": 0, "max_new_tokens": 8},
            {"regex": regex_for_dtype(bool), "temperature": 1.0, "max_new_tokens": 4},
        ],
    )
    assert outs[0]["text"] in ("yes", "no")
    int(outs[1]["text"])
    float(outs[2]["text"])
    assert outs[3]["text"] in ("True", "False")


@pytest.mark.parametrize(
    "params,needle",
    [
        ({"regex": "(?<=a)b"}, "unsupported regex"),
        ({"json_schema": {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}}}, "multipleOf"),
        ({"json_schema": "{oops"}, "not valid JSON"),
        ({"ebnf": "root ::= ("}, "invalid ebnf grammar"),
        ({"regex": "a", "json_schema": {"type": "string"}}, "at most one"),
        ({"regex": "[0-9]{40}", "max_new_tokens": 5}, "too small for this grammar"),
    ],
)
def test_bad_grammars_fail_clearly_and_the_engine_keeps_working(engine, params, needle):
    with pytest.raises(RadixflowError, match=re.escape(needle)):
        engine.generate("Hello", {"max_new_tokens": 8, **params})
    assert not engine.scheduler.has_work()
    out = engine.generate("Hello", {"max_new_tokens": 4, "temperature": 0, "regex": "[a-z]+"})
    assert re.fullmatch("[a-z]+", out["text"])


def test_compiled_grammars_and_failures_are_cached(engine):
    backend = start_grammar_backend(engine.scheduler)
    hits, misses = backend.cache.hits, backend.cache.misses
    spec = json.dumps({"type": "string", "maxLength": 7})  # not used elsewhere: a miss, then a hit
    first = backend.compile_async("json_schema", spec)
    again = backend.compile_async("json_schema", spec)
    assert again is first and (backend.cache.hits, backend.cache.misses) == (hits + 1, misses + 1)
    bad = backend.compile_async("ebnf", "x")
    assert backend.compile_async("ebnf", "x") is bad
    assert isinstance(bad.exception(), RadixflowError)


def test_json_object_free_form_greedy(engine):
    """OpenAI's response_format json_object maps to {"type": "object"}: compiles in about a
    second (depth-limited regex, not outlines-core's generic one) and gives a JSON object."""
    out = engine.generate(
        "Describe a cat as a JSON object with its name, age and favourite toys.\n",
        {"json_schema": json.dumps({"type": "object"}), "max_new_tokens": 64, "temperature": 0},
    )
    assert out["meta_info"]["completion_tokens"] <= 64
    assert isinstance(json.loads(out["text"]), dict), out["text"]
    grammar = start_grammar_backend(engine.scheduler).compile("json_schema", json.dumps({"type": "object"}))
    assert grammar.compile_s < 10, grammar.compile_s


def test_jumped_tokens_ride_in_the_same_pass_as_the_others(engine):
    """A jump costs no pass of its own: the jumping request's forced tokens and the other
    requests' single decode tokens go through one (extend) pass together."""
    schema = {"type": "object", "properties": {"first_name": {"type": "string", "maxLength": 12}, "favourite_colour": {"enum": ["red", "green", "blue"]}}, "required": ["first_name", "favourite_colour"]}
    prompts = ["Write a short poem about the sea:", "Invent a person as JSON:", "Count to twenty: one, two,"]
    params = [
        {"max_new_tokens": 24, "min_new_tokens": 24, "temperature": 0},
        {"json_schema": schema, "max_new_tokens": 24, "temperature": 0},
        {"max_new_tokens": 24, "min_new_tokens": 24, "temperature": 0},
    ]
    start_grammar_backend(engine.scheduler).compile("json_schema", json.dumps(schema))  # admitted with the others
    passes = []
    inner = engine.runner.forward

    def logged(fb):
        passes.append((fb.mode.name, list(fb.extend_lens_list)))
        return inner(fb)

    engine.runner.forward = logged
    try:
        with jump_forward(engine, True):
            outs = engine.generate(prompts, params)
    finally:
        del engine.runner.forward
    assert outs[1]["meta_info"]["jump_forward_tokens"] > 0
    assert_valid_json(outs[1], schema, 24)
    assert len(passes[0][1]) == 3, passes  # one prefill for all three
    mixed = [lens for mode, lens in passes[1:] if mode == "EXTEND" and len(lens) == 3 and max(lens) > 1]
    assert mixed and min(mixed[0]) == 1, passes  # jumped tokens travelled with the others' decode tokens
    assert len(passes) == 24, passes  # prefill + one pass per further sampled token of the 24-token requests


def test_a_grammar_that_ends_before_min_new_tokens_ends_the_output(engine):
    """min_new_tokens banned EOS while the grammar allowed only EOS: no token was left and the request failed
    with 'constrained decoding failed' (a 500; found by fuzzing). Now the grammar wins where it must end, and
    min_new_tokens still holds where the grammar may go on."""
    for regex, text in (("a", "a"), ("abc", "abc"), ("(yes|no)", None)):
        out = engine.generate("x", {"regex": regex, "min_new_tokens": 8, "max_new_tokens": 8, "temperature": 0})
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out["meta_info"]
        assert text is None or out["text"] == text
    out = engine.generate("x", {"regex": "[ab]+", "min_new_tokens": 4, "max_new_tokens": 8, "temperature": 0})
    assert out["meta_info"]["completion_tokens"] >= 4


def test_cached_tokens_never_exceed_the_prompt(engine):
    """A grammar's forced first tokens are output tokens appended before the prompt is admitted; a second request
    found them cached too and reported cached_tokens 124 of a 121-token prompt (found by fuzzing)."""
    prompt = "Write the record. " * 30
    sp = {"max_new_tokens": 40, "temperature": 0, "regex": r'\{"name": "[a-z]{1,8}", "city": "[a-z]{1,8}"\}'}
    metas = [engine.generate(prompt, sp)["meta_info"] for _ in range(2)]
    assert all(m["cached_tokens"] <= m["prompt_tokens"] for m in metas) and metas[1]["cached_tokens"] > 0


def test_requests_that_return_logprobs_do_not_jump(engine):
    """A jumped token is not sampled, so it had no logprob: the OpenAI chat route listed 1 entry for 6 tokens
    (found by fuzzing). Such requests sample every token; the others still jump."""
    sp = {"max_new_tokens": 40, "temperature": 0, "regex": r'\{"name": "[a-z]{1,8}"\}'}
    with_lp = engine.generate("Record:", sp, return_logprob=True)["meta_info"]
    plain = engine.generate("Record:", sp)["meta_info"]
    assert len(with_lp["output_token_logprobs"]) == with_lp["completion_tokens"]
    assert plain.get("jump_forward_tokens", 0) > 0 and not with_lp.get("jump_forward_tokens")


@pytest.mark.parametrize("jump", [True, False])
def test_a_stop_string_in_the_grammars_last_token_still_stops(engine, jump):
    """The grammar's end was checked before stop strings: regex "(yes|no)" with stop "o" gave "no" with matched
    null, and on outlines "abc" with stop "b" gave "abc" when jumping but "a" token by token (found by fuzzing)."""
    with jump_forward(engine, jump):
        for regex, stop, text in (("no", "o", "n"), ("abc", "b", "a"), ("[0-9]abc", "c", None)):
            out = engine.generate("x", {"regex": regex, "stop": [stop], "max_new_tokens": 8, "temperature": 0})
            reason = out["meta_info"]["finish_reason"]
            assert reason == {"type": "stop", "matched": stop}, (regex, out)
            assert (out["text"] == text) if text else (re.fullmatch("[0-9]ab", out["text"]) is not None), out["text"]
