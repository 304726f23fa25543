"""OpenAI tools on /v1/chat/completions through the official `openai` client, on the default
model (whose template has no tool support: the generic format)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from serving_helpers import API_KEY

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"], "additionalProperties": False}  # fmt: skip
TIME = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Local time in a city", "parameters": TIME,
                                      "strict": True}},  # accepted; every call is decoded under its schema anyway
]  # fmt: skip
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "unit": "celsius"}'}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, timeout=300, max_retries=0)


def _chat(client, **kw):
    args = {"model": "default", "messages": ASK, "tools": TOOLS, "temperature": 0, "max_tokens": 64, **kw}
    return client.chat.completions.create(**args)


def _calls_finished(choice) -> bool:
    """finish_reason "tool_calls", or "length" where max_tokens closed the calls early (the model
    could have gone on to another call): grammar_closed, and the calls are still complete."""
    return choice.finish_reason == "tool_calls" or (choice.finish_reason == "length" and choice.grammar_closed)


def _valid(calls) -> list:
    """(name, arguments) of each call, after checking the arguments against the function's schema."""
    out = []
    for c in calls:
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, SCHEMAS[c.function.name])
        assert c.id and c.type == "function"
        out.append((c.function.name, args))
    return out


def test_required_call_parses_and_validates(client):
    r = _chat(client, tool_choice="required", parallel_tool_calls=False)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    assert _valid(choice.message.tool_calls)[0][0] in SCHEMAS
    assert r.usage.completion_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_required_sampled_calls_validate(client):
    """Sampled, the model may go on to more calls; max_tokens then closes the last one early
    (finish "length", grammar_closed), and every call returned is still complete and valid."""
    r = _chat(client, tool_choice="required", temperature=1.0, n=2, seed=11)
    for choice in r.choices:
        assert _calls_finished(choice) and _valid(choice.message.tool_calls)


def test_named_function(client):
    r = _chat(client, tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert [name for name, _ in _valid(r.choices[0].message.tool_calls)] == ["get_time"]


def test_stream_delta_shape(client):
    want = _chat(client, tool_choice="required", parallel_tool_calls=False).choices[0].message.tool_calls[0]
    chunks = list(_chat(client, tool_choice="required", parallel_tool_calls=False, stream=True,
                        stream_options={"include_usage": True}))  # fmt: skip
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    parts = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert parts[0].id and parts[0].function.name == want.function.name  # id and name first ...
    assert all(p.index == 0 and p.id is None and p.function.name is None for p in parts[1:])  # ... then arguments
    assert len(parts) > 2 and "".join(p.function.arguments for p in parts) == want.function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage.completion_tokens > 0


def test_parallel_calls(client):
    """The tiny model itself rarely calls twice; min_tokens (EOS masked until then) leaves the
    grammar no way to end after one call, so the server must return both, each validated."""
    messages = [{"role": "user", "content": "What is the weather in Berlin and in Madrid?"}]
    r = _chat(client, messages=messages, tool_choice="required", max_tokens=100, extra_body={"min_tokens": 40})
    assert _calls_finished(r.choices[0]) and len(_valid(r.choices[0].message.tool_calls)) >= 2
    chunks = list(_chat(client, messages=messages, tool_choice="required", max_tokens=100, extra_body={"min_tokens": 40},
                        stream=True))  # fmt: skip
    indexes = {tc.index for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])}
    assert indexes == set(range(len(r.choices[0].message.tool_calls)))


def test_multi_turn_with_tool_result(client):
    messages = ASK + [{"role": "assistant", "content": None, "tool_calls": [CALL]}, RESULT]
    r = _chat(client, messages=messages, tool_choice="none", max_tokens=12)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    bare = _chat(client, tool_choice="none", max_tokens=1)
    assert r.usage.prompt_tokens > bare.usage.prompt_tokens + 20  # the call and its result are in the prompt


def test_response_format_text_goes_with_tools(client):
    """response_format {"type": "text"} is OpenAI's default and constrains nothing: it no longer refuses tools."""
    r = _chat(client, tool_choice="required", response_format={"type": "text"}, max_tokens=40)
    assert r.choices[0].message.tool_calls


def test_auto_and_none_answer_in_text(client):
    for choice in ("auto", "none"):
        r = _chat(client, tool_choice=choice, max_tokens=8)
        message = r.choices[0].message
        assert message.content and (message.tool_calls is None or choice == "auto")


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
            "n": {"type": "integer", "multipleOf": 2}}}}}]}, "multipleOf"),
        ({"tools": TOOLS + TOOLS[:1]}, "'get_weather' is used twice"),
        ({"tool_choice": {"type": "function", "function": {"name": "book_flight"}}}, "'book_flight', which is not in tools"),
        ({"messages": ASK + [{"role": "tool", "tool_call_id": "call_9", "content": "x"}]}, "tool_call_id 'call_9' matches no tool call"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "cannot be combined with tool calls"),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls must be true or false"),
        ({"messages": ASK + [{"role": "assistant", "content": None, "tool_calls": [CALL]}, {"role": "tool", "content": "x"}]},
         "a tool message needs tool_call_id"),
        ({"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]}, "strict must be true or false"),
        ({"tools": None, "functions": [{"name": "f", "parameters": TIME}]}, "deprecated names"),
    ],
)  # fmt: skip
def test_bad_tool_input_is_400(client, kwargs, needle):
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, max_tokens=2, **kwargs)
    assert needle in e.value.response.json()["error"]["message"]
    assert _chat(client, tool_choice="none", max_tokens=1).choices[0].finish_reason == "length"  # still serving
