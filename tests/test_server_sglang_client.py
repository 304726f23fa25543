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
