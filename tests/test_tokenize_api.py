"""/tokenize and /detokenize (and their /v1/ names): the server's tokenizer in SGLang's shapes, with counts that
match what the generate routes charge."""

from __future__ import annotations

import pytest


def test_tokenize_counts_what_generation_charges(server, engine):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    with server.client() as c:
        plain = c.post("/tokenize", json={"prompt": "The capital of France is"}).json()
        batch = c.post("/v1/tokenize", json={"prompt": ["a b", "The capital of France is"]}).json()
        chat = c.post("/v1/tokenize", json={"messages": messages}).json()
        completion = c.post("/v1/completions", json={"prompt": "The capital of France is", "max_tokens": 1}).json()
        answer = c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1}).json()
        info = c.get("/get_model_info").json()
    assert plain["tokens"] == engine.tokenizer.encode("The capital of France is")
    assert plain["count"] == len(plain["tokens"]) == completion["usage"]["prompt_tokens"]
    assert batch["tokens"][1] == plain["tokens"] and batch["count"] == [len(t) for t in batch["tokens"]]
    assert chat["count"] == answer["usage"]["prompt_tokens"]
    assert plain["max_model_len"] == chat["max_model_len"] == info["context_length"]


def test_tokenize_counts_tool_calls_and_tools_as_chat_renders_them(server):
    """Messages holding a tool call and its result, with and without `tools`: /tokenize rendered them with the plain
    template (the call dropped: 44 tokens where chat charged 79; fuzzing, session 28) and had no `tools` field."""
    messages = [{"role": "user", "content": "Hi"},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "content": "42", "tool_call_id": "c1"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    with server.client() as c:
        for extra in ({}, {"tools": tools}):
            counted = c.post("/tokenize", json={"messages": messages, **extra}).json()
            answer = c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1, **extra}).json()
            assert counted["count"] == answer["usage"]["prompt_tokens"], extra
        bad = c.post("/tokenize", json={"messages": messages[:1] + messages[2:]})
        lone = c.post("/tokenize", json={"prompt": "x", "tools": tools})
    assert bad.status_code == 400 and "tool_call_id" in bad.json()["error"]["message"]  # a result with no call
    assert lone.status_code == 400 and "apply to 'messages' only" in lone.json()["error"]["message"]


def test_detokenize_inverts_tokenize(server, engine):
    ids = engine.tokenizer.encode("Hello, world!")
    eos = engine.tokenizer.eos_token_id
    with server.client() as c:
        one = c.post("/detokenize", json={"tokens": ids}).json()
        many = c.post("/v1/detokenize", json={"tokens": [ids, ids[:1]]}).json()
        special = c.post("/detokenize", json={"tokens": [*ids, eos], "skip_special_tokens": False}).json()
        skipped = c.post("/detokenize", json={"tokens": [*ids, eos]}).json()
    assert one == {"text": "Hello, world!"} and many["text"] == ["Hello, world!", engine.tokenizer.decode(ids[:1])]
    assert special["text"] == "Hello, world!" + engine.tokenizer.eos_token and skipped == one


@pytest.mark.parametrize(
    "route, body, needle",
    [("/tokenize", {}, "exactly one of 'prompt'"),
     ("/tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "x"}]}, "exactly one of 'prompt'"),
     ("/tokenize", {"prompt": [1, 2]}, "prompt must be a string or a list of strings"),
     ("/tokenize", {"prompt": "x", "add_special_tokens": 1}, "add_special_tokens must be true or false"),
     ("/tokenize", {"prompt": "x", "continue_final_message": True}, "apply to 'messages' only"),
     ("/v1/tokenize", {"messages": [{"role": "user"}]}, "needs content"),
     ("/tokenize", {"prompt": "x", "text": "y"}, "unknown field(s) for /tokenize: text"),
     ("/detokenize", {"tokens": [10**9]}, "token ids in [0, "),
     ("/detokenize", {"tokens": [[1], "a"]}, "token ids in [0, "),
     ("/detokenize", {}, "token ids in [0, ")],
)  # fmt: skip
def test_bad_bodies_are_400s_that_say_what_to_change(server, route, body, needle):
    with server.client() as c:
        r = c.post(route, json=body)
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text


def test_add_generation_prompt_false_renders_no_assistant_turn(server, engine):
    """vLLM's add_generation_prompt on chat (and /tokenize): false renders the messages without the assistant turn
    to answer in; with continue_final_message it is a 400 (that flag continues the last message instead)."""
    from radixflow.runtime.tokenizer import apply_chat_template

    messages = [{"role": "user", "content": "Name a colour."}]
    want = engine.tokenizer.encode(apply_chat_template(engine.tokenizer, messages, add_generation_prompt=False),
                                   add_special_tokens=False)
    with server.client() as c:
        counted = c.post("/tokenize", json={"messages": messages, "add_generation_prompt": False}).json()
        chat = c.post("/v1/chat/completions", json={"messages": messages, "add_generation_prompt": False,
                                                    "max_tokens": 1}).json()
        both = c.post("/v1/chat/completions", json={"messages": messages + [{"role": "assistant", "content": "Re"}],
                                                   "add_generation_prompt": True, "continue_final_message": True})
    assert counted["tokens"] == want and chat["usage"]["prompt_tokens"] == len(want)
    assert both.status_code == 400 and "drop add_generation_prompt" in both.json()["error"]["message"]


def test_template_options_apply_with_tools_too(server):
    """With tools (or tool messages) the prompt went through the tool plan's own rendering, which ignored
    add_generation_prompt, continue_final_message and chat_template_kwargs, unchecked (review, session 28)."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    user = [{"role": "user", "content": "Hi"}]
    with server.client() as c:
        count = lambda **extra: c.post("/tokenize", json={"messages": user, "tools": tools, **extra}).json()  # noqa: E731
        assert count(add_generation_prompt=False)["count"] < count()["count"]
        assert count(prompt=None, add_generation_prompt=None)["count"] == count()["count"]  # null is unset
        for bad, needle in (({"continue_final_message": True}, "must be the assistant's"),
                            ({"chat_template_kwargs": 5}, "must be an object"),
                            ({"chat_template_kwargs": []}, "must be an object"),  # `or {}` let it through
                            ({"chat_template_kwargs": {"tokenizer": 1}}, "may not set tokenizer")):  # was a TypeError
            r = c.post("/v1/chat/completions", json={"messages": user, "tools": tools, "max_tokens": 1, **bad})
            assert r.status_code == 400 and needle in r.json()["error"]["message"], bad


def test_reasoning_effort_reaches_the_chat_template_as_its_variable(tokenizer):
    """SGLang's and vLLM's reasoning_effort: the template variable gpt-oss-style templates read (it was accepted and
    ignored); chat_template_kwargs' own value wins, and a non-string is a 400."""
    from radixflow.errors import RadixflowError
    from radixflow.runtime.server.openai_request import _template_options
    from radixflow.runtime.tokenizer import apply_chat_template

    user = [{"role": "user", "content": "Hi"}]
    assert _template_options({"reasoning_effort": "high"}, user)["reasoning_effort"] == "high"
    assert "reasoning_effort" not in _template_options({}, user)
    both = {"reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "low"}}
    assert _template_options(both, user)["reasoning_effort"] == "low"
    with pytest.raises(RadixflowError, match="reasoning_effort must be a string"):
        _template_options({"reasoning_effort": 3}, user)
    saved = tokenizer.chat_template
    tokenizer.chat_template = "Reasoning: {{ reasoning_effort | default('medium') }}\n{{ messages[0]['content'] }}"
    try:
        assert apply_chat_template(tokenizer, user, **_template_options({"reasoning_effort": "high"}, user)).startswith(
            "Reasoning: high\nHi")
    finally:
        tokenizer.chat_template = saved
