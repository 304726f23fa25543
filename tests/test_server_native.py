"""The native (SGLang-compatible) HTTP API against a real server on the default model."""

from __future__ import annotations

import json

import httpx
import pytest
from serving_helpers import API_KEY, wait_idle

GREEDY = {"temperature": 0, "max_new_tokens": 12}
PROMPTS = ["The capital of France is", "List three colors:", "def fibonacci(n):"]


def sse_events(lines) -> list:
    events = []
    for line in lines:
        if not line.startswith("data: "):
            assert line == "", line
            continue
        payload = line[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_generate_matches_engine(server, engine):
    with server.client() as c:
        r = c.post("/generate", json={"text": PROMPTS[0], "sampling_params": GREEDY})
    assert r.status_code == 200, r.text
    got = r.json()
    want = engine.generate(PROMPTS[0], GREEDY)
    assert got["text"] == want["text"] and got["output_ids"] == want["output_ids"]
    meta = got["meta_info"]
    assert set(want["meta_info"]) <= set(meta)
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert meta["prompt_tokens"] == want["meta_info"]["prompt_tokens"] and meta["completion_tokens"] == 12
    assert meta["e2e_latency"] > 0


def test_batch_and_input_ids_match_engine(server, engine):
    want = engine.generate(PROMPTS, GREEDY)
    ids = [engine.tokenizer.encode(p) for p in PROMPTS]
    with server.client() as c:
        by_text = c.post("/generate", json={"text": PROMPTS, "sampling_params": GREEDY}).json()
        by_ids = c.post("/generate", json={"input_ids": ids[1], "sampling_params": GREEDY}).json()
    assert [o["text"] for o in by_text] == [o["text"] for o in want]
    assert by_ids["output_ids"] == want[1]["output_ids"]


def test_stream_is_cumulative_and_ends_done(server, engine):
    want = engine.generate(PROMPTS[2], GREEDY)
    with server.client() as c:
        with c.stream("POST", "/generate", json={"text": PROMPTS[2], "sampling_params": GREEDY, "stream": True}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) >= 2
    for a, b in zip(chunks, chunks[1:]):  # cumulative: each text extends the previous one
        assert b["text"].startswith(a["text"]) and len(b["output_ids"]) > len(a["output_ids"])
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["text"] == want["text"] and chunks[-1]["output_ids"] == want["output_ids"]


def test_batch_stream_has_index(server):
    body = {"text": PROMPTS[:2], "sampling_params": {**GREEDY, "max_new_tokens": 4}, "stream": True}
    with server.client() as c, c.stream("POST", "/generate", json=body) as r:
        events = sse_events(r.iter_lines())
    finals = {e["index"]: e for e in events[:-1] if e["meta_info"]["finish_reason"]}
    assert sorted(finals) == [0, 1]


def test_samples_of_one_prompt_stream_with_their_index(server):
    """n > 1 on one prompt: its samples' chunks interleave, so each says which it is (found by fuzzing: they had no
    index), and the non-streamed answer is a list, as for a batch."""
    body = {"text": PROMPTS[0], "sampling_params": {"max_new_tokens": 3, "n": 2, "temperature": 1.0}}
    with server.client() as c:
        with c.stream("POST", "/generate", json={**body, "stream": True}) as r:
            events = sse_events(r.iter_lines())[:-1]
        whole = c.post("/generate", json=body).json()
    assert all("index" in e for e in events) and {e["index"] for e in events} == {0, 1}
    assert isinstance(whole, list) and len(whole) == 2


def test_stop_string_trimmed_in_stream_and_final(server, engine):
    sp = {"temperature": 0, "max_new_tokens": 24, "stop": ["\n"]}
    want = engine.generate("Write a haiku about the sea.", sp)
    body = {"text": "Write a haiku about the sea.", "sampling_params": sp, "stream": True}
    with server.client() as c, c.stream("POST", "/generate", json=body) as r:
        events = sse_events(r.iter_lines())[:-1]
    texts = [e["text"] for e in events]
    assert texts[-1] == want["text"]
    assert all("\n" not in t for t in texts)
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))


@pytest.mark.parametrize("stop_regex", [r"\n\w", "The sea is"], ids=["regex", "plain-text"])
def test_stop_regex_in_stream_and_final(server, engine, stop_regex):
    """Over HTTP as in-process; a stream never shows text its final answer cuts (plain text is cut like a stop
    string, so its beginning is held back: "The sea is" spans tokens, and the stream reaches "The" first), and a
    regex's matched text stays in both."""
    sp = {"temperature": 0, "max_new_tokens": 32, "stop_regex": stop_regex}
    want = engine.generate("Write a haiku about the sea.", sp)
    assert want["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_regex}, want
    body = {"text": "Write a haiku about the sea.", "sampling_params": sp, "stream": True}
    with server.client() as c, c.stream("POST", "/generate", json=body) as r:
        texts = [e["text"] for e in sse_events(r.iter_lines())[:-1]]
    assert texts[-1] == want["text"] and all(b.startswith(a) for a, b in zip(texts, texts[1:]))


def test_token_ids_logprob_over_http(server, engine):
    body = {"text": PROMPTS[0], "sampling_params": {**GREEDY, "max_new_tokens": 2}, "return_logprob": True,
            "token_ids_logprob": [5, 7042], "return_text_in_logprobs": True}  # fmt: skip
    with server.client() as c:
        meta = c.post("/generate", json=body).json()["meta_info"]
        refused = c.post("/generate", json={**body, "token_ids_logprob": [-3]})
    want = engine.generate(PROMPTS[0], {**GREEDY, "max_new_tokens": 2}, return_logprob=True,
                           token_ids_logprob=[5, 7042])["meta_info"]  # fmt: skip
    assert [[t[1] for t in row] for row in meta["output_token_ids_logprobs"]] == [[5, 7042]] * 2
    for got, ref in zip(meta["output_token_ids_logprobs"], want["output_token_ids_logprobs"]):
        assert [t[0] for t in got] == pytest.approx([t[0] for t in ref], abs=1e-3) and isinstance(got[0][2], str)
    assert refused.status_code == 400 and "token_ids_logprob" in refused.json()["error"]["message"]


def test_logprobs(server, engine):
    body = {"text": PROMPTS[0], "sampling_params": {**GREEDY, "max_new_tokens": 3}, "return_logprob": True,
            "logprob_start_len": 0, "top_logprobs_num": 2, "return_text_in_logprobs": True}  # fmt: skip
    with server.client() as c:
        meta = c.post("/generate", json=body).json()["meta_info"]
    want = engine.generate(PROMPTS[0], {**GREEDY, "max_new_tokens": 3}, return_logprob=True, logprob_start_len=0,
                           top_logprobs_num=2)["meta_info"]  # fmt: skip
    assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"]
    assert meta["input_token_logprobs"][0][0] is None
    assert [e[1] for e in meta["output_token_logprobs"]] == [e[1] for e in want["output_token_logprobs"]]
    for got, ref in zip(meta["output_token_logprobs"], want["output_token_logprobs"]):
        assert got[0] == pytest.approx(ref[0], abs=1e-3) and isinstance(got[2], str)
    assert len(meta["output_top_logprobs"]) == 3 and len(meta["output_top_logprobs"][0]) == 2
    # greedy: the chosen token is the top-1 alternative
    assert meta["output_top_logprobs"][0][0][1] == meta["output_token_logprobs"][0][1]


def test_cached_tokens_on_repeat(server):
    prompt = "A repeated prompt about radix trees and key-value caches, said twice. " * 3
    with server.client() as c:
        first = c.post("/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": 2}}).json()
        second = c.post("/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": 2}}).json()
    assert second["meta_info"]["cached_tokens"] > 0
    assert second["meta_info"]["cached_tokens"] >= first["meta_info"]["prompt_tokens"] - 1


def test_n_samples_prompt_major(server):
    body = {"text": PROMPTS[:2], "sampling_params": {"max_new_tokens": 3, "n": 2, "temperature": 0.8}}
    with server.client() as c:
        out = c.post("/generate", json=body).json()
    assert len(out) == 4 and all(o["meta_info"]["completion_tokens"] == 3 for o in out)


def test_model_and_server_info(server):
    with server.client() as c:
        model = c.get("/get_model_info").json()
        assert c.get("/model_info").json() == model
        info = c.get("/get_server_info").json()
        assert c.get("/server_info").status_code == 200
    assert model["is_generation"] is True and model["architectures"] == ["LlamaForCausalLM"]
    assert info["max_total_num_tokens"] == 32768 and "api_key" not in info
    assert info["free_slots"] + info["used_slots"] == info["max_total_num_tokens"]
    assert isinstance(info["max_running_requests"], int) and info["max_running_requests"] >= 1  # resolved, not null
    assert info["scheduler_pid"] > 0 and info["detokenizer_pid"] > 0


def test_health_routes(server):
    with server.client() as c:
        assert c.get("/health").status_code == 200
        assert c.get("/ready").status_code == c.get("/ping").status_code == 200  # SGLang's other names
        assert c.get("/health_generate").status_code == 200


def test_flush_cache(server):
    with server.client() as c:
        c.post("/generate", json={"text": "Flush me " * 8, "sampling_params": {"max_new_tokens": 1}})
        wait_idle(server)
        r = c.post("/flush_cache")
        assert r.status_code == 200 and "flushed" in r.text.lower()
        assert server.info()["cached_slots"] == 0
        assert c.get("/flush_cache").status_code == 200


def test_metrics(server):
    with server.client() as c:
        c.post("/generate", json={"text": PROMPTS[0], "sampling_params": {"max_new_tokens": 2}})
        text = c.get("/metrics").text
    for name in ("num_running_reqs", "num_queue_reqs", "token_usage", "cache_hit_rate", "grammar_rows_switched", "prompt_tokens_total",
                 "generation_tokens_total", "time_to_first_token_seconds_bucket",
                 "inter_token_latency_seconds_bucket", "e2e_request_latency_seconds_count"):  # fmt: skip
        assert f"radixflow:{name}" in text, name
    count = [line for line in text.splitlines() if line.startswith("radixflow:e2e_request_latency_seconds_count")]
    assert float(count[0].split()[-1]) >= 1


BAD_BODIES = [
    (b"{not json", "malformed JSON"),
    (b"[1, 2]", "JSON object"),
    (b"", "empty"),
    (json.dumps({"sampling_params": {"max_new_tokens": 1}}).encode(), "exactly one of text"),
    (json.dumps({"text": "hi", "input_ids": [1, 2]}).encode(), "exactly one of text"),
    (json.dumps({"text": 5}).encode(), "must be a string"),
    (json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": "3"}}).encode(), "max_new_tokens"),
    (json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": -1}}).encode(), "max_new_tokens must be >= 0"),
    (json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 10**9}}).encode(), "limit"),
    (json.dumps({"text": "hi", "sampling_params": {"temprature": 0}}).encode(), "unknown sampling param"),
    (json.dumps({"text": "hi", "sampling_params": [1]}).encode(), "sampling_params"),
    (json.dumps({"text": "hi", "stream": "yes"}).encode(), "stream must be"),
    (json.dumps({"input_ids": [1, -5]}).encode(), "input_ids must be integers"),
    (json.dumps({"input_ids": [1] * 9000}).encode(), "context length"),
    (json.dumps({"text": ["a"] * 25}).encode(), "at most 24"),
    (json.dumps({"text": "hi", "sampling_params": {"regex": "(?=a)b"}}).encode(), "unsupported regex"),
    (json.dumps({"text": "hi", "image_data": "x"}).encode(), "image_data"),
    (json.dumps({"text": "hi", "sampling_params": {"logit_bias": {"abc": 1}}}).encode(), "logit_bias key"),
    (json.dumps({"text": "hi", "sampling_params": {"logit_bias": {"99999999": 1}}}).encode(), "logit_bias key"),
    (json.dumps({"text": "hi", "sampling_params": {"logit_bias": {"\u00b2": 1}}}).encode(), "logit_bias key"),  # isdigit
    (json.dumps({"text": "hi", "sampling_params": {"logit_bias": {"2": 1e39}}}).encode(), "outside [-100, 100]"),
]


@pytest.mark.parametrize("body,needle", BAD_BODIES, ids=[n for _, n in BAD_BODIES])
def test_bad_input_gets_400(server, body, needle):
    with server.client() as c:
        r = c.post("/generate", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert needle.lower() in r.json()["error"]["message"].lower()


def test_body_size_limit(server):
    with server.client() as c:
        r = c.post("/generate", json={"text": "x" * 300_000})
    assert r.status_code == 413 and "bytes" in r.json()["error"]["message"]


def test_unknown_route_has_error_body(server):
    with server.client() as c:
        r = c.get("/nope")
    assert r.status_code == 404 and "message" in r.json()["error"]


PROTECTED = [("POST", "/generate"), ("PUT", "/generate"), ("GET", "/get_model_info"), ("GET", "/model_info"),
             ("GET", "/get_server_info"), ("GET", "/server_info"), ("GET", "/health_generate"),
             ("POST", "/flush_cache"), ("GET", "/flush_cache"), ("POST", "/abort_request"), ("GET", "/metrics"),
             ("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
             ("POST", "/tokenize"), ("POST", "/v1/detokenize"), ("GET", "/nope")]  # fmt: skip


@pytest.mark.parametrize("method,path", PROTECTED)
@pytest.mark.parametrize("auth", [None, "Bearer wrong", API_KEY, f"Bearer {API_KEY}x"])
def test_auth_required(server, method, path, auth):
    headers = {"Authorization": auth} if auth else {}
    r = httpx.request(method, server.url + path, headers=headers, json={"text": "hi"}, timeout=30)
    assert r.status_code == 401
    assert "API key" in r.json()["error"]["message"]


def test_health_is_open(server):
    for path in ("/health", "/ready", "/ping"):
        assert httpx.get(server.url + path, timeout=30).status_code == 200


def test_start_and_stop_profile_write_a_chrome_trace_of_the_steps(server, tmp_path):
    """SGLang's /start_profile and /stop_profile: torch.profiler around the scheduler's steps; num_steps stops it by
    itself; a second start, a stop with none running and bad fields are 400s that say why."""
    import json

    def traces():
        return sorted(tmp_path.glob("radixflow-*.trace.json"))

    gen = {"text": PROMPTS[0], "sampling_params": {**GREEDY, "max_new_tokens": 4}}
    with server.client() as c:
        started = c.post("/start_profile", json={"output_dir": str(tmp_path), "activities": ["CPU"]})
        again = c.post("/start_profile", json={"output_dir": str(tmp_path)})
        assert c.post("/generate", json=gen).status_code == 200
        stopped = c.post("/stop_profile")
        none_running = c.post("/stop_profile")
        bad = [c.post("/start_profile", json=body) for body in ({"num_steps": 0}, {"activities": ["MEM"]}, {"x": 1},
                                                                  {"output_dir": "/proc/radixflow-no-such-dir"})]
        assert started.status_code == 200 and str(tmp_path) in started.text
        assert again.status_code == 400 and "already running" in again.json()["error"]["message"]
        assert stopped.status_code == 200 and none_running.status_code == 400
        assert [r.status_code for r in bad] == [400] * 4 and "cannot hold the trace" in bad[3].json()["error"]["message"]
        assert "traceEvents" in json.loads(traces()[0].read_text())
        auto = c.post("/start_profile", json={"output_dir": str(tmp_path), "num_steps": 2})
        assert auto.status_code == 200 and c.post("/generate", json=gen).status_code == 200
        after = c.post("/stop_profile")  # it stopped after two steps by itself
    assert after.status_code == 400 and "stopped after its num_steps" in after.json()["error"]["message"]
    assert len(traces()) == 2
