"""Tool calls without a model: the formats' grammars, the parser (whole and streamed), the
request validation and the generic prompt."""

from __future__ import annotations

import itertools
import json
import random
import re

import jsonschema
import pytest

from radixflow.constrained import Grammar, regex_for_schema
from radixflow.errors import RadixflowError
from radixflow.runtime.server_args import _CHOICES
from radixflow.runtime.server.tool_formats import FORMATS, PARSER_CHOICES, avoiding, detect_format, parse
from radixflow.runtime.server.tool_request import format_calls, generic_history, grammar, parse_tool_choice, parse_tools
from radixflow.runtime.server.tool_response import ToolStream, tool_message

WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                  "required": ["city"], "additionalProperties": False}  # fmt: skip
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "now", "description": "the time"}},
]
CALLS = [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, {"name": "now", "arguments": {}}]


def _calls(fmt) -> list:
    return [{"name": c["name"], fmt.args_key: c["arguments"]} for c in CALLS]


def test_parser_choices_match_server_args():
    assert set(_CHOICES["tool_call_parser"]) == set(PARSER_CHOICES)


@pytest.mark.parametrize("word", ["<tool_call>\n", "[TOOL_CALLS", "<ab"])
def test_avoiding_matches_exactly_the_texts_without_the_word(word):
    rx = re.compile(avoiding(word), re.S)
    alphabet = sorted(set(word)) + ["x"]
    texts = ["".join(t) for n in range(7) for t in itertools.product(alphabet, repeat=n) if len(alphabet) ** n < 50000]
    rng = random.Random(0)
    texts += [rng.choice(["", "x<", "a"]) + word[: rng.randint(0, len(word))] + "".join(rng.choices(alphabet, k=8)) for _ in range(3000)]
    for t in texts:
        assert (rx.fullmatch(t) is not None) == (word not in t), repr(t)


@pytest.mark.parametrize("name", ["hermes", "mistral", "llama3"])
def test_grammar_accepts_the_formats_own_calls_and_rejects_others(name):
    fmt, tools = FORMATS[name], parse_tools(TOOLS)
    text = format_calls(fmt, _calls(fmt))
    required = re.compile(grammar(tools, fmt, "required", None, True))
    assert required.fullmatch(text)
    assert not re.fullmatch(grammar(tools, fmt, "required", None, False), text)  # two calls, parallel off
    assert re.fullmatch(grammar(tools, fmt, "named", "now", False), format_calls(fmt, _calls(fmt)[1:]))
    assert not re.fullmatch(grammar(tools, fmt, "named", "now", False), format_calls(fmt, _calls(fmt)[:1]))
    bad = format_calls(fmt, [{"name": "get_weather", fmt.args_key: {"city": "Paris", "days": 0}}])  # minimum 1
    assert not required.fullmatch(bad)
    auto = re.compile(grammar(tools, fmt, "auto", None, True), re.S)
    assert auto.fullmatch("Just text.") and auto.fullmatch("")
    if fmt.after_text:
        assert auto.fullmatch("Let me look.\n" + text)
        assert not auto.fullmatch("Let me look.\n" + text[:-3])  # a call, once opened, must be finished
    assert auto.fullmatch(text) and not auto.fullmatch(bad)


@pytest.mark.parametrize("backend", ["outlines", "llguidance"])
@pytest.mark.parametrize("name", ["hermes", "mistral", "llama3"])
def test_compiled_grammar_admits_parallel_calls(name, backend):
    """The regexes' promises hold token by token, as the model writes the text, on both
    backends (outlines-core 0.2.14 alone lost the token that starts a second call: fsm.py)."""
    fmt, tools = FORMATS[name], parse_tools(TOOLS)
    two, one = format_calls(fmt, _calls(fmt)), format_calls(fmt, _calls(fmt)[:1])
    required = Grammar.from_regex(grammar(tools, fmt, "required", None, True), backend=backend)
    assert required.accepts(two) and required.accepts(one) and not required.accepts(two[:-2])
    single = Grammar.from_regex(grammar(tools, fmt, "required", None, False), backend=backend)
    assert single.accepts(one) and not single.accepts(two)
    auto = Grammar.from_regex(grammar(tools, fmt, "auto", None, True), backend=backend)
    prefix = "Let me look.\n" if fmt.after_text else ""
    assert auto.accepts(prefix + two) and auto.accepts(prefix + one) and auto.accepts("Just text.")
    assert not auto.accepts(prefix + two[:-2])


@pytest.mark.parametrize("name", ["hermes", "mistral", "llama3"])
def test_parse_whole_and_streamed(name):
    fmt = FORMATS[name]
    prefix = "Checking.\n" if fmt.after_text else ""
    text = prefix + format_calls(fmt, _calls(fmt))
    msg, finish = tool_message(fmt, text, "stop")
    assert finish == "tool_calls" and msg["content"] == (prefix.strip() or None)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]] == [
        (c["name"], c["arguments"]) for c in CALLS
    ]
    stream, deltas = ToolStream(fmt), []
    for end in range(1, len(text) + 1):  # one character at a time
        delta, fin = stream.delta(text[:end], end == 1, end == len(text), "stop" if end == len(text) else None)
        deltas.append(delta)
    assert deltas[0]["role"] == "assistant" and fin == "tool_calls"
    assert "".join(d.get("content", "") for d in deltas) == (msg["content"] or "")  # the "\n" before the call: in neither
    calls: dict = {}
    for d in deltas:
        for c in d.get("tool_calls", []):
            slot = calls.setdefault(c["index"], {"id": c.get("id"), "name": c.get("function", {}).get("name"), "args": ""})
            slot["args"] += c["function"]["arguments"]
    assert [(calls[k]["name"], json.loads(calls[k]["args"])) for k in sorted(calls)] == [(c["name"], c["arguments"]) for c in CALLS]
    assert all(v["id"] for v in calls.values())


def test_empty_output_streams_empty_content_as_the_message_has():
    fmt = FORMATS["hermes"]
    msg, finish = tool_message(fmt, "", "stop")
    assert msg["content"] == "" and finish == "stop"
    delta, fin = ToolStream(fmt).delta("", True, True, "stop")
    assert delta == {"role": "assistant", "content": ""} and fin == "stop"


def test_output_without_a_complete_call_stays_content():
    fmt = FORMATS["hermes"]
    cut = format_calls(fmt, _calls(fmt))[:30]
    assert tool_message(fmt, cut, "length") == ({"role": "assistant", "content": cut, "reasoning_content": None, "tool_calls": None}, "length")
    assert parse("a <tool_c", fmt, final=False).content == "a "  # held back: may open a call


def test_a_call_cut_by_a_stop_string_ends_the_stream_as_the_whole_response():
    """A stop string inside a call (`"stop": ["Oslo"]`): the whole response keeps the output as content with finish
    "stop", while the stream, which had sent the call's name and partial arguments, ended with "tool_calls"
    (fuzzing, session 31). Its deltas stay sent; its finish reason is now the whole response's."""
    fmt = FORMATS["hermes"]
    whole = format_calls(fmt, _calls(fmt))
    cut = whole[: whole.index('"arguments"') + 20]  # the name out, the arguments begun
    assert tool_message(fmt, cut, "stop")[1] == "stop"
    stream = ToolStream(fmt)
    for end in range(1, len(cut) + 1):
        delta, fin = stream.delta(cut[:end], end == 1, end == len(cut), "stop" if end == len(cut) else None)
    assert stream.ids and fin == "stop"


def test_generated_arguments_validate():
    """What the grammar admits is what the schema admits, for samples of the regex's language."""
    fmt, tools = FORMATS["hermes"], parse_tools(TOOLS)
    for args in [{"city": "Oslo"}, {"city": "a\"b", "days": 7}]:
        text = format_calls(fmt, [{"name": "get_weather", "arguments": args}])
        assert re.fullmatch(grammar(tools, fmt, "required", None, False), text)
        jsonschema.validate(json.loads(tool_message(fmt, text, "stop")[0]["tool_calls"][0]["function"]["arguments"]), WEATHER_PARAMS)


@pytest.mark.parametrize(
    "tools,needle",
    [
        ("get_weather", "tools must be a list"),
        ([{"type": "function", "function": {"parameters": {}}}], "function.name"),
        ([{"type": "function", "function": {"name": "a b"}}], "function.name"),
        ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}], '"type": "object"'),
        ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}}}}], "multipleOf"),
        (TOOLS + TOOLS[:1], "used twice"),
    ],
)  # fmt: skip
def test_bad_tools(tools, needle):
    with pytest.raises(RadixflowError, match=re.escape(needle)):
        parse_tools(tools)


def test_bad_tool_choice():
    tools = parse_tools(TOOLS)
    with pytest.raises(RadixflowError, match="'nope', which is not in tools"):
        parse_tool_choice({"type": "function", "function": {"name": "nope"}}, tools)
    with pytest.raises(RadixflowError, match="needs tools"):
        parse_tool_choice("required", [])
    assert parse_tool_choice(None, tools) == ("auto", None) and parse_tool_choice(None, []) == ("none", None)


def test_detect_format_and_generic_history():
    assert detect_format("{{ messages }}").name == "generic"
    assert detect_format("{% if tools %}<tool_call>{% endif %}").name == "hermes"
    assert detect_format("{% if tools %}[TOOL_CALLS]{% endif %}").name == "mistral"
    assert detect_format("{% if tools %}<|python_tag|>{% endif %}").name == "llama3"
    fmt = FORMATS["generic"]
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    history = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "content": "21 C", "tool_call_id": "call_1", "name": "get_weather"}]  # fmt: skip
    out = generic_history(history, parse_tools(TOOLS), fmt)
    assert out[0]["role"] == "system" and '"name": "get_weather"' in out[0]["content"]
    assert out[2] == {"role": "assistant", "content": format_calls(fmt, [{"name": "get_weather", "arguments": {"city": "Paris"}}])}
    assert out[3] == {"role": "user", "content": "<tool_response>\n21 C\n</tool_response>"}


def test_arguments_keep_the_schemas_property_order():
    params = {"type": "object", "properties": {"zone": {"type": "string"}, "amount": {"type": "integer"}},
              "required": ["zone", "amount"]}  # fmt: skip
    tools = parse_tools([{"type": "function", "function": {"name": "pay", "parameters": params}}])
    rx = grammar(tools, FORMATS["generic"], "required", None, False)
    call = {"name": "pay", "arguments": {"zone": "eu", "amount": 3}}  # as the prompt lists them
    assert re.fullmatch(rx, format_calls(FORMATS["generic"], [call]))


def test_tool_parameters_loosen_what_the_json_schema_route_refuses():
    """pydantic writes `pattern` beside `minLength` and unions as oneOf; tools have no backend but the regex
    conversion, so these are loosened there (the pattern kept, oneOf as anyOf), not refused (review of fuzz round 4)."""
    params = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[a-z]+$", "minLength": 1},
                                                "n": {"oneOf": [{"type": "integer"}, {"type": "number"}]}},
              "required": ["code", "n"]}  # fmt: skip
    tool = parse_tools([{"type": "function", "function": {"name": "f", "parameters": params}}])[0]
    rx = re.compile(tool.args_regex)
    assert rx.fullmatch('{"code":"abc","n":1.5}') and not rx.fullmatch('{"code":"ABC","n":1}')
    with pytest.raises(RadixflowError, match="pattern with minLength"):
        regex_for_schema(params)
