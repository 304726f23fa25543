"""The OpenAI-compatible API, through the official `openai` client and raw httpx."""

from __future__ import annotations

import json

import openai
import pytest
from serving_helpers import API_KEY
from test_server_native import sse_events

PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Name a primary color."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def chat_prompt(engine):
    from radixflow.runtime.tokenizer import apply_chat_template

    return apply_chat_template(engine.tokenizer, MESSAGES)


def test_models(client):
    models = client.models.list().data
    assert len(models) == 1 and models[0].id == "default" and models[0].owned_by == "radixflow"
    assert client.models.retrieve("default") == models[0] == client.models.list().data[0]  # `created` stays put
    with pytest.raises(openai.NotFoundError, match="serves 'default'"):
        client.models.retrieve("gpt-4o")


def test_null_flags_are_unset(client):
    """The client types stream, logprobs and echo as optional: a wrapper passing stream=None sent null, refused
    with "stream must be true or false" (fuzzing, session 28). Null is unset."""
    chat = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=2, stream=None,
                                          logprobs=None)
    legacy = client.completions.create(model="default", prompt=PROMPT, max_tokens=2, echo=None, stream=None)
    assert chat.choices[0].logprobs is None and not legacy.choices[0].text.startswith(PROMPT)


def test_completion_top_logprobs_hold_the_sampled_token(client):
    """OpenAI: "the API will always return the logprob of the sampled token, so there may be up to logprobs+1
    elements"; a sampled token outside the top-k was missing (fuzzing), and logprobs 0 gave null."""
    for k in (0, 1):
        r = client.completions.create(model="default", prompt="The weather", max_tokens=8, logprobs=k,
                                      temperature=1.5, seed=3)
        lp = r.choices[0].logprobs
        assert all(tok in top and top[tok] == v and len(top) <= k + 1
                   for tok, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs)), (k, lp)


def test_completion_matches_engine(client, engine):
    want = engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 10})
    r = client.completions.create(model="default", prompt=PROMPT, max_tokens=10, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text == want["text"]
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == want["meta_info"]["prompt_tokens"] and r.usage.completion_tokens == 10
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_completion_stream_with_usage(client, engine):
    want = engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 8})
    chunks = list(client.completions.create(model="default", prompt=PROMPT, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))  # fmt: skip
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == want["text"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0  # the prompt was served before


def test_completion_batch_echo_logprobs(client, engine):
    r = client.completions.create(model="default", prompt=[PROMPT, "1, 2, 3,"], max_tokens=3, temperature=0,
                                  logprobs=2, echo=True)  # fmt: skip
    assert len(r.choices) == 2 and r.choices[1].text.startswith("1, 2, 3,")
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(engine.tokenizer.encode(PROMPT)) + 3
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.token_logprobs[0] is None  # the first prompt token has no logprob
    assert all(isinstance(v, float) and v <= 0 for v in lp.token_logprobs[1:])
    assert len(lp.top_logprobs[-1]) == 2 and lp.text_offset == sorted(lp.text_offset)


def test_chat_matches_engine(client, engine, chat_prompt):
    want = engine.generate(chat_prompt, {"temperature": 0, "max_new_tokens": 12})
    r = client.chat.completions.create(model="default", messages=MESSAGES, max_completion_tokens=12, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want["text"]
    r2 = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=12, temperature=0)
    assert r2.choices[0].message.content == want["text"]
    assert r2.usage.prompt_tokens_details.cached_tokens > 0  # same prompt again: served from the radix cache


def test_chat_stream_with_usage(client, engine, chat_prompt):
    want = engine.generate(chat_prompt, {"temperature": 0, "max_new_tokens": 10})
    chunks = list(client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))  # fmt: skip
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == want["text"]
    assert chunks[-1].usage.total_tokens == chunks[-1].usage.prompt_tokens + 10
    no_usage = list(client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=2, stream=True))
    assert all(c.usage is None for c in no_usage)


def test_stream_usage_is_null_until_the_last_chunk(server):
    """OpenAI: with include_usage every chunk carries `usage`, null but on the last (choices [])."""
    body = {"model": "default", "messages": MESSAGES, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    with server.client() as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        events = sse_events(r.iter_lines())
    chunks = events[:-1]
    assert events[-1] == "[DONE]" and all("usage" in e and e["usage"] is None for e in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


def test_null_max_completion_tokens_leaves_max_tokens(server):
    """Clients that send unset fields as null: `max_completion_tokens: null` beside `max_tokens` ran to the end of
    the context (fuzzing, session 28); null is unset, so max_tokens holds."""
    body = {"model": "default", "messages": MESSAGES, "max_tokens": 3, "max_completion_tokens": None, "temperature": 0,
            "ignore_eos": True}
    with server.client() as c:
        r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_continuous_usage_stats_count_each_chunk(server):
    """vLLM's and SGLang's stream_options.continuous_usage_stats: every chunk carries the counts so far; unknown
    stream_options are refused (they were ignored)."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {"model": "default", "prompt": "Count: 1, 2,", "max_tokens": 4, "temperature": 0, "stream": True,
            "stream_options": options, "ignore_eos": True}  # fmt: skip
    with server.client() as c:
        with c.stream("POST", "/v1/completions", json=body) as r:
            chunks = sse_events(r.iter_lines())[:-1]
        bad = c.post("/v1/completions", json={**body, "stream_options": {"include_usage": True, "usage": True}})
    counts = [e["usage"]["completion_tokens"] for e in chunks[:-1]]
    assert counts == sorted(counts) and counts[-1] == 4 and chunks[-1]["usage"]["completion_tokens"] == 4
    prompt = chunks[-1]["usage"]["prompt_tokens"]
    assert all(e["usage"]["prompt_tokens"] == prompt and e["usage"]["total_tokens"] == prompt + n for e, n in zip(chunks, counts))
    assert bad.status_code == 400 and "unknown stream_options field(s): usage" in bad.json()["error"]["message"]


def test_chat_n_stop_seed_logprobs(client):
    r = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=4, n=3, temperature=0.9, seed=7)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert 3 <= r.usage.completion_tokens <= 12
    again = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=4, n=3, temperature=0.9, seed=7)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]  # seeded
    stop = client.completions.create(model="default", prompt="Count: 1, 2, 3,", max_tokens=20, temperature=0, stop=[","])
    assert "," not in stop.choices[0].text and stop.choices[0].finish_reason == "stop"
    lp = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=3, temperature=0, logprobs=True,
                                        top_logprobs=2)  # fmt: skip
    content = lp.choices[0].logprobs.content
    assert len(content) == 3 and len(content[0].top_logprobs) == 2
    assert content[0].top_logprobs[0].token == content[0].token  # greedy picks the top-1


def test_sglang_extras(client):
    r = client.completions.create(model="default", prompt=PROMPT, max_tokens=6, temperature=0,
                                  extra_body={"ignore_eos": True, "top_k": 1, "min_tokens": 6, "repetition_penalty": 1.1})  # fmt: skip
    assert r.usage.completion_tokens == 6
    r = client.completions.create(model="default", prompt="Is the sky blue? Answer:", max_tokens=4, temperature=0,
                                  extra_body={"regex": "(yes|no)"})  # fmt: skip
    assert r.choices[0].text in ("yes", "no")


def test_response_format_json_schema(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    r = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=16, temperature=0,
                                       response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})  # fmt: skip
    assert isinstance(json.loads(r.choices[0].message.content)["ok"], bool)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"max_tokens": -1}, "max_tokens must be"),  # the OpenAI name, not max_new_tokens
        ({"extra_body": {"bogus_field": 1}}, "unknown field"),
        ({"temperature": "hot"}, "temperature"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "role"),
        ({"top_logprobs": 3}, "logprobs"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"extra_body": {"min_p": 2}}, "min_p"),
    ],
)
def test_chat_bad_input(client, kwargs, needle):
    args = {"model": "default", "messages": MESSAGES, "max_tokens": 2, **kwargs}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**args)
    assert needle in e.value.response.json()["error"]["message"]


def test_wrong_key_is_401(server):
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_raw_httpx_stream(server):
    body = {"model": "x", "prompt": PROMPT, "max_tokens": 3, "stream": True, "temperature": 0}
    with server.client() as c, c.stream("POST", "/v1/completions", json=body) as r:
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]" and all(e["object"] == "text_completion" for e in events[:-1])
    assert events[-2]["choices"][0]["finish_reason"] == "length"


GEN = {"op": "gen", "id": 1, "name": "a", "sampling_params": {"max_new_tokens": 1}}


def test_inputs_the_server_cannot_use_are_400s_not_500s(server):
    """Found by fuzzing: each was a 500 (an exception past the validation)."""
    bad = [("/v1/completions", {"model": "default", "prompt": [-1], "max_tokens": 2}, "[0, "),
           ("/v1/completions", {"model": "default", "prompt": [[1], [2**40]], "max_tokens": 2}, "[0, "),
           ("/v1/chat/completions", {"model": "default", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}],
                                     "chat_template_kwargs": {"documents": 5}}, "chat template"),
           ("/program", {"program": {"ops": [{"op": "text", "text": "Q:"},
                                             {"op": "gen", "id": 1, "name": "a", "sampling_params": "x"}]}}, "object"),
           ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 4, "temperature": 0,  # valid, too wide
                                                           "ebnf": "start: " + " | ".join(f'"w{i}"' for i in range(3000))}},
            "parser's limits"),
           ("/abort_request", {"rid": "x", "abort_al": True}, "unknown field"),
           ("/program", {"programs": [{"rid": "p", "ops": [{"op": "text", "text": "Q:"}, GEN]}] * 2}, "same rid"),
           ("/v1/chat/completions", {"model": "default", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}],
                                     "response_format": {"type": "json_object"}, "regex": "a+"}, "send one of them"),
           ("/separate_reasoning", {"text": "a", "parser": "qwen3"}, "unknown field")]  # fmt: skip
    with server.client() as c:
        for path, body, needle in bad:
            r = c.post(path, json=body)
            assert r.status_code == 400 and needle in r.json()["error"]["message"], (path, r.text)
        assert c.post("/v1/completions", json={"model": "default", "prompt": [1, 2], "max_tokens": 1}).status_code == 200


def test_logprobs_of_tokens_that_hold_part_of_a_character(server):
    """Found by fuzzing: chat logprobs' `bytes` were U+FFFD's for every byte token, so a CJK answer could not be
    rebuilt from them; legacy completions' text_offset ran past the text; and a token the grammar put in place of a
    sampled one (a budget repair) kept the sampled token's id and logprob. Now the bytes join to the content, a
    byte token shows as OpenAI's "bytes:\\x..", offsets count characters, and a repaired token's logprob is null."""
    cjk = {"regex": "[\u4e00-\u9fff]{2}", "temperature": 0}
    with server.client() as c:
        chat = c.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4, "logprobs": True,
                                                    "top_logprobs": 2, **cjk}).json()["choices"][0]  # fmt: skip
        legacy = c.post("/v1/completions", json={"prompt": "中文：我喜欢", "max_tokens": 5, "logprobs": 2,
                                                 "temperature": 0}).json()["choices"][0]  # fmt: skip
        c_id, = c.post("/tokenize", json={"prompt": "c", "add_special_tokens": False}).json()["tokens"]
        repair = {"regex": "a(c[0-9]{30})?", "logit_bias": {str(c_id): 100.0}, "temperature": 0}  # `c` after `a`
        native = c.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 8, **repair},
                                           "return_logprob": True, "top_logprobs_num": 2}).json()  # fmt: skip
    content = chat["logprobs"]["content"]
    assert bytes(b for e in content for b in e["bytes"]).decode() == chat["message"]["content"]
    lp = legacy["logprobs"]
    assert any(t.startswith("bytes:\\x") for t in lp["tokens"]) and "\ufffd" not in "".join(lp["tokens"])
    assert lp["text_offset"] == sorted(lp["text_offset"]) and max(lp["text_offset"]) < len(legacy["text"])
    entries = native["meta_info"]["output_token_logprobs"]
    assert [e[1] for e in entries] == native["output_ids"]
    assert any(e[0] is None for e in entries)  # `c` then needs 30 digits, past the budget: it is replaced by EOS
    assert len(native["meta_info"]["output_top_logprobs"]) == len(entries)
    assert all((e[0] is None) == (t is None) for e, t in zip(entries, native["meta_info"]["output_top_logprobs"]))


def test_token_bytes_of_each_vocabulary_kind(engine):
    from types import SimpleNamespace

    from radixflow.runtime.token_bytes import TokenBytes

    byte_level = TokenBytes(engine.tokenizer)
    ids = engine.tokenizer.encode("编辑 Hello 😖", add_special_tokens=False)
    assert b"".join(byte_level(i) for i in ids).decode() == "编辑 Hello 😖" and len(ids) > 4
    pieces = {0: "<0xE6>", 1: "▁the", 2: "<s>"}  # a SentencePiece vocabulary with byte fallback
    sp = SimpleNamespace(convert_ids_to_tokens=pieces.get, decode=lambda ids: pieces[ids[0]], all_special_ids=[2],
                         get_vocab=lambda: {p: i for i, p in pieces.items()})
    fallback = TokenBytes(sp)
    assert (fallback(0), fallback(1), fallback(2)) == (b"\xe6", b" the", b"<s>")
