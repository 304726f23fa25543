"""SGLang's own frontend (`sglang.lang`, RuntimeEndpoint) against our server, unchanged.

Needs `pip install --no-deps sglang==0.5.23` plus the few modules its import chain
pulls in (pinned in pyproject's test extra); skipped when sglang is not importable.
"""

from __future__ import annotations

import pytest
from serving_helpers import API_KEY

sgl = pytest.importorskip("sglang", reason="sglang frontend not installed (pip install --no-deps sglang==0.5.23)")


@pytest.fixture(scope="module")
def backend(server):
    return sgl.RuntimeEndpoint(server.url, api_key=API_KEY)


@sgl.function
def capital(s, country):
    s += f"The capital of {country} is"
    s += sgl.gen("answer", max_tokens=8, temperature=0, stop="\n")


@sgl.function
def pick(s):
    s += "Q: Is fire hot or cold?\nA: It is"
    s += sgl.select("choice", choices=[" hot", " cold"])


def test_gen_matches_engine(backend, engine):
    state = capital.run(country="France", backend=backend)
    want = engine.generate("The capital of France is", {"temperature": 0, "max_new_tokens": 8, "stop": "\n"})
    assert state["answer"] == want["text"]
    meta = state.get_meta_info("answer")
    assert meta["prompt_tokens"] > 0 and meta["finish_reason"]["type"] in ("stop", "length")


def test_select_uses_logprobs(backend):
    state = pick.run(backend=backend)
    assert state["choice"] in (" hot", " cold")
    meta = state.get_meta_info("choice")
    assert len(meta["normalized_prompt_logprobs"]) == 2
    assert state["choice"] == [" hot", " cold"][max(range(2), key=lambda i: meta["normalized_prompt_logprobs"][i])]


def test_streaming(backend, engine):
    state = capital.run(country="Italy", backend=backend, stream=True)
    pieces = list(state.text_iter("answer"))
    want = engine.generate("The capital of Italy is", {"temperature": 0, "max_new_tokens": 8, "stop": "\n"})
    assert len(pieces) >= 2 and "".join(pieces) == want["text"]


def test_batch_and_cache_helpers(backend):
    states = capital.run_batch([{"country": "Spain"}, {"country": "Japan"}], backend=backend, num_threads=2)
    assert all(s["answer"] for s in states)
    info = backend.get_server_info()
    assert info["max_total_num_tokens"] > 0


@sgl.function
def encode_in_parallel(s, facts):
    s += "Please memorize these statements.\n"
    forks = s.fork(len(facts))
    forks += lambda i: f"Statement {i}: {facts[i]}\n"
    forks.join(mode="concate_and_append")  # SGLang's client calls /concate_and_append_request here
    s += "Question: Who is the father of Julian?\nAnswer:" + sgl.gen("answer", max_tokens=6, temperature=0)


def test_concatenate_and_append_join(backend):
    facts = ["Ethan is the father of Liam.", "Noah is the father of Julian."]
    state = encode_in_parallel.run(facts=facts, backend=backend)
    assert "Statement 0: Ethan is the father of Liam.\nStatement 1: Noah is the father of Julian.\n" in state.text()
    assert state["answer"]


def test_concate_and_append_route_validates_its_body(server):
    import httpx

    headers = {"Authorization": f"Bearer {API_KEY}"}
    ok = httpx.post(f"{server.url}/concate_and_append_request", json={"src_rids": ["a", "b"], "dst_rid": "c"}, headers=headers)
    assert ok.status_code == 200 and ok.json() == {"success": True}
    bad = httpx.post(f"{server.url}/concate_and_append_request", json={"src_rids": "a"}, headers=headers)
    assert bad.status_code == 400 and "src_rids" in bad.json()["error"]["message"]


def test_logprobs_carry_their_length(server):
    import httpx

    body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 4, "temperature": 0}, "return_logprob": True}
    out = httpx.post(f"{server.url}/generate", json=body, headers={"Authorization": f"Bearer {API_KEY}"}).json()
    meta = out["meta_info"]
    assert meta["output_token_logprobs_length"] == len(meta["output_token_logprobs"]) == meta["completion_tokens"] == 4
