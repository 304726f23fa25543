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
