"""One validation for every route (issue 27): the same bad input gets the same 400 from
native /generate, the OpenAI routes, /program, Engine and the DSL; SGLang's own fields
are accepted at values that change nothing (sglang-router adds them); budget-closed
grammar outputs say so in their finish reason."""

from __future__ import annotations

import inspect
import json

import pytest

import radixflow as rf
from radixflow.errors import RadixflowError

NAME_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "role": {"type": "string"}, "city": {"type": "string"}},
    "required": ["name", "role", "city"],
}
PERSON_PROMPT = 'Farid Novak is an engineer who lives in Lisbon. As JSON with name, role and city: '


def program_with(sampling: dict) -> dict:
    return {"ops": [{"op": "text", "text": "Say hi:"}, {"op": "gen", "id": 1, "name": "x", "sampling_params": sampling}]}


def http_answers(server, sampling: dict, openai: dict) -> dict:
    """Status and error message of each HTTP route for the same (bad) input."""
    bodies = {
        "/generate": {"text": "Say hi:", "sampling_params": sampling},
        "/generate stream": {"text": "Say hi:", "sampling_params": sampling, "stream": True},
        "/v1/completions": {"prompt": "Say hi:", **openai},
        "/v1/chat/completions": {"messages": [{"role": "user", "content": "Say hi"}], **openai},
        "/program": {"program": program_with(sampling)},
    }
    out = {}
    with server.client() as c:
        for name, body in bodies.items():
            r = c.post(name.split()[0], json=body)
            out[name] = (r.status_code, r.json()["error"]["message"] if r.status_code != 200 else "")
    return out


def engine_errors(engine, sampling: dict) -> dict:
    out = {}
    for name, call in (("Engine.generate", lambda: engine.generate("Say hi:", sampling)),
                       ("Engine.run_program", lambda: engine.run_program(program_with(sampling)))):  # fmt: skip
        with pytest.raises(RadixflowError) as e:
            call()
        out[name] = str(e.value)
    return out


BAD_SAMPLING = [
    ({"stop": [""], "max_new_tokens": 2}, {"stop": [""], "max_tokens": 2}, "stop strings must not be empty"),
    ({"stop_token_ids": [10**7], "max_new_tokens": 2}, {"stop_token_ids": [10**7], "max_tokens": 2}, "stop_token_ids"),
    ({"stop_regex": "(", "max_new_tokens": 2}, {"stop_regex": "(", "max_tokens": 2}, "is not a valid regular expression"),
    ({"stop_regex": ["x", "a*"], "max_new_tokens": 2}, {"stop_regex": ["x", r"\b"], "max_tokens": 2}, "matches the empty text"),
    ({"stop_regex": "(a+)+b", "max_new_tokens": 2}, {"stop_regex": r"(\w+\s?)*$", "max_tokens": 2}, "nests unbounded repeats"),
    ({"regex": "", "max_new_tokens": 2}, {"json_schema": False, "max_tokens": 2}, "or null for no grammar"),
]


@pytest.mark.parametrize("sampling,openai,needle", BAD_SAMPLING,
                         ids=["empty-stop", "stop-id-out-of-vocab", "stop-regex-invalid", "stop-regex-empty-match",
                             "stop-regex-nested-repeats", "grammar-empty"])
def test_bad_sampling_is_a_400_on_every_route(server, engine, sampling, openai, needle):
    for route, (status, msg) in http_answers(server, sampling, openai).items():
        assert status == 400 and needle in msg, (route, status, msg)
    for route, msg in engine_errors(engine, sampling).items():
        assert needle in msg, (route, msg)


def test_grammar_minimum_is_a_400_on_every_route(server, engine):
    sampling = {"json_schema": json.dumps(NAME_SCHEMA), "max_new_tokens": 2}
    rf_schema = {"type": "json_schema", "json_schema": {"name": "n", "schema": NAME_SCHEMA}}
    openai = {"json_schema": json.dumps(NAME_SCHEMA), "max_tokens": 2}
    answers = http_answers(server, sampling, openai)
    with server.client() as c:
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                                 "response_format": rf_schema})  # fmt: skip
        answers["/v1/chat/completions response_format"] = (r.status_code, r.json().get("error", {}).get("message", ""))
    for route, (status, msg) in answers.items():
        assert status == 400 and "too small for this grammar" in msg, (route, status, msg)
        name = "max_tokens" if "/v1/" in route else "max_new_tokens"  # each route names its own field
        assert f"{name}=2 " in msg and f"raise {name} " in msg, (route, msg)
    for route, msg in engine_errors(engine, sampling).items():
        assert "too small for this grammar" in msg, (route, msg)

    @rf.function
    def tiny(s):
        s += "Name someone: " + rf.gen("person", max_tokens=2, json_schema=NAME_SCHEMA)

    for backend in (engine, rf.RuntimeEndpoint(server.url, api_key=server.api_key)):
        for mode in ("graph", "eager"):
            with pytest.raises(rf.ProgramError, match="too small for this grammar"):
                tiny.run(backend=backend, mode=mode)


def test_unknown_top_level_fields_are_refused_everywhere(server, engine):
    with server.client() as c:
        answers = {
            "/generate": c.post("/generate", json={"text": "hi", "return_logprobs": True}),
            "/v1/completions": c.post("/v1/completions", json={"prompt": "hi", "return_logprobs": True}),
            "/v1/chat/completions": c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                                         "return_logprobs": True}),  # fmt: skip
            "/program": c.post("/program", json={"program": program_with({"max_new_tokens": 1}), "return_logprobs": True}),
            "/program op": c.post("/program", json={"program": {"ops": [{"op": "text", "txt": "a"}]}}),
        }
    for route, r in answers.items():
        assert r.status_code == 400, (route, r.text)
        assert "unknown field" in r.json()["error"]["message"], (route, r.text)
    with pytest.raises(RadixflowError, match="return_logprobs"):
        engine.generate("hi", {"max_new_tokens": 1}, return_logprobs=True)
    with pytest.raises(RadixflowError, match="unknown field"):
        engine.run_program({**program_with({"max_new_tokens": 1}), "id": 3})


def test_sglang_fields_are_accepted_when_they_change_nothing(server, engine):
    router_extras = {"return_hidden_states": False, "data_parallel_rank": 0, "bootstrap_room": None, "priority": 3,
                     "lora_path": [None], "log_metrics": True}  # fmt: skip
    chat_extras = {"continue_final_message": False, "return_hidden_states": False, "separate_reasoning": True,
                   "bootstrap_host": None, "routed_dp_rank": 1}  # fmt: skip
    want = engine.generate("The capital of France is", {"max_new_tokens": 3, "temperature": 0})
    with server.client() as c:
        native = c.post("/generate", json={"text": "The capital of France is", "sampling_params": {"max_new_tokens": 3, "temperature": 0},
                                           **router_extras})  # fmt: skip
        chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                                    **chat_extras})  # fmt: skip
        hidden = c.post("/generate", json={"text": "hi", "return_hidden_states": True})
        lora = c.post("/v1/completions", json={"prompt": "hi", "lora_path": "my-adapter"})
    assert native.status_code == 200 and native.json()["output_ids"] == want["output_ids"]
    assert chat.status_code == 200, chat.text
    assert engine.generate("The capital of France is", {"max_new_tokens": 3, "temperature": 0},
                           return_hidden_states=False)["output_ids"] == want["output_ids"]  # fmt: skip
    for r, field in ((hidden, "return_hidden_states"), (lora, "lora_path")):
        assert r.status_code == 400 and field in r.json()["error"]["message"], r.text
    with pytest.raises(RadixflowError, match="return_hidden_states"):
        engine.generate("hi", return_hidden_states="last")


def test_sglang_sampling_fields_are_inert_or_refused(server, engine):
    """spaces_between_special_tokens and stream_interval (SGLang's frontend sends the first with every
    gen) are accepted at values that change nothing, and refused otherwise, by the native API,
    the Engine and the OpenAI routes alike."""
    base = {"max_new_tokens": 3, "temperature": 0}
    want = engine.generate("The capital of France is", base)["output_ids"]
    inert = dict(base, spaces_between_special_tokens=True, stream_interval=4)
    assert engine.generate("The capital of France is", inert)["output_ids"] == want
    with pytest.raises(RadixflowError, match="spaces_between_special_tokens=False is not supported"):
        engine.generate("hi", dict(base, spaces_between_special_tokens=False))
    with server.client() as c:
        ok = c.post("/generate", json={"text": "The capital of France is", "sampling_params": inert})
        refused = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "spaces_between_special_tokens": False})
        accepted = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "spaces_between_special_tokens": True})
    assert ok.status_code == 200 and ok.json()["output_ids"] == want
    assert refused.status_code == 400 and "spaces_between_special_tokens" in refused.json()["error"]["message"]
    assert accepted.status_code == 200, accepted.text


def test_every_api_takes_its_sampling_names_from_one_table():
    from radixflow.lang import primitives
    from radixflow.lang.function import RUN_SAMPLING_PARAMS
    from radixflow.runtime.sampling_params import SAMPLING_DEFAULTS, SamplingParams, api_names
    from radixflow.runtime.server import openai_request

    assert SamplingParams() == SamplingParams(**SAMPLING_DEFAULTS)
    openai, gen = api_names("openai"), api_names("gen")
    assert openai_request._SAMPLING_FIELDS == openai and primitives._GEN_TO_SAMPLING == gen
    assert openai["seed"] == "sampling_seed" and openai["min_tokens"] == "min_new_tokens" and "max_new_tokens" not in openai
    assert gen["max_tokens"] == "max_new_tokens" and set(gen) <= set(inspect.signature(rf.gen).parameters)
    assert set(openai.values()) | set(gen.values()) | set(RUN_SAMPLING_PARAMS) <= set(SAMPLING_DEFAULTS)


def test_continue_final_message_continues_the_assistant_turn(server, engine):
    from radixflow.runtime.tokenizer import apply_chat_template

    messages = [{"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "The capital of France is"}]  # fmt: skip
    prompt = apply_chat_template(engine.tokenizer, messages, add_generation_prompt=False, continue_final_message=True)
    assert prompt.rstrip().endswith("The capital of France is")
    want = engine.generate(input_ids=engine.tokenizer.encode(prompt, add_special_tokens=False),
                           sampling_params={"max_new_tokens": 4, "temperature": 0})  # fmt: skip
    with server.client() as c:
        r = c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "temperature": 0,
                                                 "continue_final_message": True})  # fmt: skip
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == want["text"]


def test_budget_closed_output_reports_a_length_finish(server, engine):
    tight = {"json_schema": json.dumps(PERSON_SCHEMA), "max_new_tokens": 16, "temperature": 0}
    roomy = {**tight, "max_new_tokens": 200}
    short, full = engine.generate([PERSON_PROMPT, PERSON_PROMPT], [tight, roomy])
    assert json.loads(short["text"]).keys() == {"name", "role", "city"}  # still valid ...
    assert short["meta_info"]["finish_reason"] == {"type": "length", "length": 16, "grammar_closed": True, "matched": None}
    assert full["meta_info"]["finish_reason"]["type"] == "stop"  # ... a finished one says stop
    assert "grammar_closed" not in full["meta_info"]["finish_reason"]
    with server.client() as c:
        native = c.post("/generate", json={"text": PERSON_PROMPT, "sampling_params": tight}).json()
        chat = c.post("/v1/completions", json={"prompt": PERSON_PROMPT, "max_tokens": 16, "temperature": 0,
                                               "json_schema": json.dumps(PERSON_SCHEMA)}).json()  # fmt: skip
    assert native["meta_info"]["finish_reason"] == short["meta_info"]["finish_reason"]
    assert chat["choices"][0]["finish_reason"] == "length" and chat["choices"][0]["grammar_closed"] is True
    assert chat["choices"][0]["text"] == short["text"]


class _TokenId(int):
    """An int subclass (as an IntEnum is): accepted as a token id, like a plain int."""


@pytest.mark.parametrize(
    "ids, ok",
    [([0, 5, 99], True), ([_TokenId(3), 4], True), ([1, 100], False), ([-1, 2], False), ([1, True], False),
     ([1, 2.0], False), ([1, "2"], False), ([1, None], False), ([False], False)],
)  # fmt: skip
def test_input_ids_are_checked_token_by_token_in_c_or_python(ids, ok):
    """The plain-int fast path (type set, min, max) and the per-item path agree: bools, floats,
    strings and ids outside the vocabulary are refused wherever they sit; int subclasses pass."""
    from radixflow.runtime.generate_request import GenerateInput, RequestBuilder

    builder = RequestBuilder(None, vocab_size=100, context_len=1000, max_pool_tokens=1000)
    g = GenerateInput(input_ids=ids, sampling_params={"max_new_tokens": 1})
    if ok:
        assert builder.build(g)[0].origin_input_ids == ids
    else:
        with pytest.raises(RadixflowError, match="input_ids must be integers"):
            builder.build(g)


def test_max_new_tokens_is_cut_to_the_room_the_context_leaves():
    """The output ends at the context length anyway; cut here, a grammar's budget closes its output within that
    room (found by fuzzing: an 8,187-token prompt with max_new_tokens 16 ended as '{"a":1', a length finish)."""
    from radixflow.runtime.generate_request import GenerateInput, RequestBuilder

    builder = RequestBuilder(None, vocab_size=100, context_len=20, max_pool_tokens=1000)
    fits, cut = builder.build(GenerateInput(input_ids=[[1] * 4, [1] * 16], sampling_params={"max_new_tokens": 8,
                                                                                            "min_new_tokens": 6}))
    assert (fits.sampling.max_new_tokens, fits.sampling.min_new_tokens) == (8, 6)
    assert (cut.sampling.max_new_tokens, cut.sampling.min_new_tokens) == (4, 4)


def test_max_new_tokens_is_cut_to_the_kv_pool_and_its_default_to_the_limit():
    """A request that outgrew the KV pool hung the server (fuzzing, session 29): its outputs now end where the pool
    is full (the last needs no KV). The default max_new_tokens (128) over --max-new-tokens-limit was a 400 for a
    value the caller never sent; it is cut to the limit, and an explicit value over it is still refused."""
    from radixflow.runtime.generate_request import GenerateInput, RequestBuilder

    builder = RequestBuilder(None, vocab_size=100, context_len=1000, max_pool_tokens=30, max_new_tokens_limit=50)
    pooled, = builder.build(GenerateInput(input_ids=[1] * 20, sampling_params={"max_new_tokens": 40}))
    assert pooled.sampling.max_new_tokens == 11
    builder.max_pool_tokens = 1000
    assert builder.build(GenerateInput(input_ids=[1], sampling_params={}))[0].sampling.max_new_tokens == 50
    with pytest.raises(RadixflowError, match="max_new_tokens=51 is over this server's limit of 50"):
        builder.build(GenerateInput(input_ids=[1], sampling_params={"max_new_tokens": 51}))


def test_grammar_backend_none_refuses_every_grammar_and_serves_the_rest():
    """SGLang's --grammar-backend none: a request with a grammar is a 400 saying why; others run as before."""
    from radixflow.runtime.generate_request import GenerateInput, RequestBuilder

    builder = RequestBuilder(None, vocab_size=100, context_len=1000, max_pool_tokens=1000, grammar_backend="none")
    for grammar in ({"regex": "[ab]+"}, {"json_schema": '{"type": "object"}'}, {"ebnf": 'root ::= "a"'}):
        with pytest.raises(RadixflowError, match=rf"takes no grammars \(--grammar-backend none\).*{next(iter(grammar))}"):
            builder.build(GenerateInput(input_ids=[1, 2], sampling_params={"max_new_tokens": 2, **grammar}))
    assert builder.build(GenerateInput(input_ids=[1, 2], sampling_params={"max_new_tokens": 2}))[0].sampling.grammar is None


def test_openai_chat_fields_are_typed_as_openai_types_them(server):
    """Found by fuzzing: these were accepted whatever their value (parallel_tool_calls only checked with tools, a
    message without content rendered as empty, continue_final_message silently off after a user turn)."""
    user = [{"role": "user", "content": "hi"}]
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    refused = [
        ({"parallel_tool_calls": "x"}, "parallel_tool_calls must be true or false"),
        ({"user": 5}, "user must be a string"),
        ({"store": 1}, "store must be true or false"),
        ({"metadata": "m"}, "metadata must be an object"),
        ({"messages": [{"role": "user"}]}, "messages[0] (user) needs content"),
        ({"continue_final_message": True}, "it is 'user': add the assistant's partial answer"),
    ]
    accepted = [{"user": "bob", "store": False, "metadata": {"k": "v"}, "parallel_tool_calls": False},
                {"messages": [*user, {"role": "assistant", "content": None, "tool_calls": [call]},
                              {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}]  # fmt: skip
    with server.client() as c:
        for extra, needle in refused:
            r = c.post("/v1/chat/completions", json={"messages": user, "max_tokens": 2, **extra})
            assert r.status_code == 400 and needle in r.json()["error"]["message"], (extra, r.text)
        for extra in accepted:
            r = c.post("/v1/chat/completions", json={"messages": user, "max_tokens": 2, **extra})
            assert r.status_code == 200, (extra, r.text)


def test_grammar_errors_say_what_is_wrong(server):
    """llguidance's "NoExtensionBias" (nothing matches), a hint naming a server flag for a keyword no backend
    enforces, and a 500 for a grammar that forces a token forever: each found by fuzzing."""
    cases = [
        ({"regex": "a[^\\x00-\\U0010ffff]b"}, "invalid or unsupported regex: it matches no text at all"),
        ({"ebnf": "start: start"}, "it matches no text at all"),
        ({"json_schema": json.dumps({"$ref": "#"})}, "unsupported JSON schema: it matches no text at all"),
        ({"json_schema": json.dumps({"not": {"type": "string"}})}, "radixflow cannot enforce 'not'; remove it"),
        ({"ebnf": 'root ::= "a" root'}, "the grammar is over the parser's limits"),
    ]
    with server.client() as c:
        for grammar, needle in cases:
            r = c.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 8, **grammar}})
            assert r.status_code == 400 and needle in r.json()["error"]["message"], (grammar, r.text)
            assert "NoExtensionBias" not in r.text and "--grammar-backend" not in r.text
        wrong_method = c.get("/v1/chat/completions")
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"
    assert wrong_method.json()["error"] == {"message": "GET is not allowed on /v1/chat/completions; use POST",
                                            "type": "invalid_request_error", "param": None, "code": 405}  # fmt: skip


def test_chat_text_parts_are_joined_as_sglang_joins_them(server):
    """A list of text parts was joined with "" (found in review: "Say" + "hello." rendered as "Sayhello."); SGLang
    joins them with spaces for a template that takes text, and takes the responses API's "input_text" too."""
    client = server.client()

    def tokens(content):
        r = client.post("/tokenize", json={"messages": [{"role": "user", "content": content}]})
        assert r.status_code == 200, r.text
        return r.json()["tokens"]

    assert tokens([{"type": "text", "text": "Say"}, {"type": "input_text", "text": "hello."}]) == tokens("Say hello.")
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}], "max_tokens": 1})
    assert r.status_code == 400 and "only text parts are supported" in r.json()["error"]["message"]


def test_grammar_backend_none_on_the_openai_routes_names_the_field_and_parses_auto_tool_calls_unconstrained(engine):
    """--grammar-backend none: response_format, a required or named tool call are refused in the request's terms;
    tools with tool_choice auto still work, their calls parsed from unconstrained output (as SGLang's): the first
    version refused them for a regex the client never sent (review)."""
    from types import SimpleNamespace

    from radixflow.runtime.server.openai_request import chat_call, completion_call
    from radixflow.runtime.server_args import ServerArgs

    info = SimpleNamespace(context_len=engine.runner.context_len, vocab_size=engine.runner.vocab_size)
    tm = SimpleNamespace(args=ServerArgs(grammar_backend="none"), tokenizer=engine.tokenizer, info=info,
                         sampling_defaults={})
    user = [{"role": "user", "content": "Weather in Paris?"}]
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}]
    auto = chat_call(tm, {"messages": user, "tools": tools, "max_tokens": 4})
    assert auto.tools is not None and auto.g.sampling_params.get("regex") is None
    for extra, field in (({"tool_choice": "required"}, "tool_choice 'required'"),
                         ({"tool_choice": {"type": "function", "function": {"name": "weather"}}}, "naming a function"),
                         ({"response_format": {"type": "json_object"}}, "without response_format"),
                         ({"regex": "[ab]+"}, "without regex")):
        with pytest.raises(RadixflowError, match=field):
            chat_call(tm, {"messages": user, "tools": tools if "tool_choice" in extra else None, "max_tokens": 4, **extra})
    with pytest.raises(RadixflowError, match="without json_schema"):
        completion_call(tm, {"prompt": "Hi", "json_schema": '{"type": "object"}'})
