"""LLM programs against a real `radixflow serve` (started by rf.Runtime): request graphs
through POST /program, eager runs through /generate, the OpenAI-compatible backend."""

from __future__ import annotations

import re

import pytest

import radixflow as rf

from lang_programs import FEW_SHOT, capital_select, chat_two_turns, concat_story, few_shot_qa, one_sentence, template_fill

GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def runtime():
    rt = rf.Runtime(max_total_tokens=16384, log_level="warning")
    yield rt
    rt.shutdown()


def metric(rt, name: str) -> float:
    m = re.search(rf"^radixflow:{name}\{{[^}}]*\}} ([0-9.e+-]+)$", rt.endpoint.metrics(), re.M)
    assert m, f"metric {name} missing"
    return float(m.group(1))


@pytest.mark.parametrize("program,kwargs", [(few_shot_qa, {"question": "What is the capital of France?"}), (concat_story, {"name": "Ada"})])
def test_static_program_same_greedy_result_as_graph_and_eager_on_server_and_engine(runtime, engine, program, kwargs):
    graph = program.run(backend=runtime, **kwargs, **GREEDY)
    eager = program.run(backend=runtime, mode="eager", **kwargs, **GREEDY)
    local = program.run(backend=engine, **kwargs, **GREEDY)
    assert (graph.mode, eager.mode, local.mode) == ("graph", "eager", "graph")
    assert graph.text() == eager.text() == local.text()
    assert graph.variables() == eager.variables() == local.variables()


def test_graph_path_is_one_server_request_per_program(runtime):
    before = metric(runtime, "num_requests_total")
    graph = template_fill.run(name="Ada", backend=runtime, max_new_tokens=2, **GREEDY)
    mid = metric(runtime, "num_requests_total")
    eager = template_fill.run(name="Ada", backend=runtime, mode="eager", max_new_tokens=2, **GREEDY)
    after = metric(runtime, "num_requests_total")
    assert (mid - before, after - mid) == (1, 5)  # one /program vs five /generate calls
    assert graph.program_meta["num_requests"] == 1 and graph.program_meta["continued_segments"] == 4
    assert graph.text() == eager.text()


def test_run_batch_reuses_the_shared_prefix_kv_on_server(runtime):
    assert runtime.flush_cache()
    questions = [f"What is the capital of {c}?" for c in ("France", "Italy", "Japan", "Egypt", "Peru", "Kenya", "Chile", "India")]
    states = few_shot_qa.run_batch([{"question": q} for q in questions], backend=runtime, progress_bar=False, max_new_tokens=4, **GREEDY)
    assert [s.mode for s in states] == ["graph"] * 8
    assert all(s.text().startswith(FEW_SHOT + f"Q: {q}") for s, q in zip(states, questions))
    cached = sum(s.program_meta["cached_tokens"] for s in states)
    prompt = sum(s.program_meta["prompt_tokens"] for s in states)
    info = runtime.get_server_info()
    print(f"server run_batch(8): cached {cached}/{prompt} prompt tokens, cache hit rate {info['cache_hit_rate']:.2f}")
    assert cached / prompt > 0.5 and info["cache_hit_rate"] > 0.5


@rf.function
def echo_gen(s, q, t=0.0):
    s += q + rf.gen("a", max_tokens=3, temperature=t)


def test_run_batch_on_server_keeps_the_programs_the_server_did_not_refuse(runtime):
    """A /program refused (400) failed the whole run_batch, whose graphs then ran again one at a time; now the refused
    one alone fails, and each good one runs once."""
    before = metric(runtime, "num_requests_total")
    states = echo_gen.run_batch([{"q": "Hi"}, {"q": "x " * 9000}, {"q": "Hi", "t": -1.0}, {"q": "Yo"}],
                                backend=runtime, progress_bar=False)
    assert [s.error() is None for s in states] == [True, False, False, True]
    assert "context length" in str(states[1].error()) and "temperature must be >= 0" in str(states[2].error())
    assert metric(runtime, "num_requests_total") - before == 3  # the two good ones and the one over the context


def test_streaming_runs_as_one_request_graph_on_the_server(runtime):
    before = metric(runtime, "num_requests_total")
    state = one_sentence.run(topic="the sea", stream=True, backend=runtime, **GREEDY)
    deltas = list(state.text_iter("sentence"))
    assert state.mode == "graph" and metric(runtime, "num_requests_total") - before == 1
    eager = one_sentence.run(topic="the sea", backend=runtime, mode="eager", **GREEDY)
    assert "".join(deltas) == state["sentence"] == eager["sentence"] and len(deltas) > 1
    whole = "".join(concat_story.run(name="Ada", stream=True, backend=runtime, **GREEDY).text_iter())
    assert whole == concat_story.run(name="Ada", backend=runtime, mode="eager", **GREEDY).text()
    r = runtime.endpoint.client.post("/program", json={"programs": [{"ops": []}], "stream": True})
    assert r.status_code == 400 and "streams one" in r.json()["error"]["message"]


def test_program_route_rejects_bad_programs(runtime):
    r = runtime.endpoint.client.post("/program", json={"program": {"ops": [{"op": "gen", "id": 1, "name": "x", "sampling_params": {"top_p": 9}}]}})
    assert r.status_code == 400 and "gen 'x'" in r.json()["error"]["message"]


def test_openai_endpoint_gen_and_select_through_logprobs(runtime):
    model = runtime.endpoint.client.get("/v1/models").json()["data"][0]["id"]
    oe = rf.OpenAIEndpoint(runtime.url + "/v1", model=model)
    c = capital_select.run(country="France", backend=oe, max_new_tokens=2, **GREEDY)
    assert c.mode == "eager" and c["capital"] == " Paris" and len(c.get_meta_info("capital")["normalized_prompt_logprobs"]) == 3
    chat = rf.OpenAIEndpoint(runtime.url + "/v1", model=model, chat=True)
    t = chat_two_turns.run(question="What is the capital of France?", backend=chat, **GREEDY)
    assert [m["role"] for m in t.messages()] == ["system", "user", "assistant", "user", "assistant"]
    assert t["first"] and t.messages()[2]["content"] == t["first"]
    with pytest.raises(rf.ProgramError, match="select"):
        capital_select.run(country="France", backend=chat)


def test_sglangs_runtime_helpers_generate_stream_tokenize_and_cache_a_programs_prefix(runtime):
    """SGLang's Runtime.generate (a JSON string), async_generate (the text once, piece by piece), get_tokenizer,
    and f.cache(): a program's constant prefix prefilled, so its first run after a flush finds it cached."""
    import asyncio
    import json

    prompt, params = "The capital of France is", {"max_new_tokens": 6, "temperature": 0}
    out = json.loads(runtime.generate(prompt, params))
    assert out["text"] and out["meta_info"]["completion_tokens"] == 6

    async def pieces():
        return [p async for p in runtime.async_generate(prompt, params)]

    streamed = asyncio.run(pieces())
    assert len(streamed) > 1 and "".join(streamed) == out["text"]
    assert runtime.get_tokenizer().encode(prompt, add_special_tokens=False) == runtime.endpoint.tokenizer.encode(
        prompt, add_special_tokens=False)

    def first_run_cached() -> int:
        return few_shot_qa.run(question="What is the capital of Peru?", backend=runtime, max_new_tokens=2,
                               **GREEDY).program_meta["cached_tokens"]

    assert runtime.flush_cache()
    assert first_run_cached() == 0
    assert runtime.flush_cache()
    assert few_shot_qa.cache(backend=runtime) is True  # FEW_SHOT + "Q: ": 82 characters before the argument
    assert first_run_cached() >= len(runtime.get_tokenizer().encode(FEW_SHOT, add_special_tokens=False)) - 1
    assert echo_gen.cache(backend=runtime) is False  # it starts with its argument: nothing constant to cache


def test_runtime_endpoint_takes_sglangs_arguments(runtime, monkeypatch):
    import httpx

    made, real = [], httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda *a, **kw: made.append(kw) or real(*a, **kw))
    endpoint = rf.RuntimeEndpoint(runtime.url, api_key=runtime.api_key, verify=False)
    assert endpoint.get_model_name() and made[-1]["verify"] is False  # handed to httpx as SGLang hands it to requests
    endpoint.close()
    with pytest.raises(rf.RadixflowError, match="chat_template_name='chatml'.*--chat-template"):
        rf.RuntimeEndpoint(runtime.url, chat_template_name="chatml")
