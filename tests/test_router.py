"""`radixflow serve --dp-size 2`: two CPU replicas behind sglang-router, one setup for the module.

Covers what a client sends through the router (native generate, streaming, batched ids, the
OpenAI routes), what the router reads from the replicas (/get_load, server and model info,
/flush_cache), cache-aware routing landing a repeated prefix on the replica that has it, and a
replica killed under load: no request fails, and the supervisor starts it again.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import signal
import time

import httpx
import pytest

from serving_helpers import start_server

from radixflow.errors import RadixflowError
from radixflow.runtime.server_args import ServerArgs

RESTART_TIMEOUT_S = 240


def test_replica_flags_reproduce_the_server_args():
    """The supervisor starts each replica with ServerArgs.to_cli; parsed back, they are the same args."""
    import argparse

    args = ServerArgs(dp_size=2, router_policy="round_robin", max_total_tokens=4096, disable_radix_cache=True,
                      api_key="k", log_interval_s=2.5)  # fmt: skip
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    argv = args.to_cli(host="127.0.0.1", port=1234, dp_size=1, router_policy=None, router_args=None)
    back = ServerArgs.from_cli(parser.parse_args(argv))
    assert back == ServerArgs(max_total_tokens=4096, disable_radix_cache=True, api_key="k", log_interval_s=2.5, port=1234)
    with pytest.raises(RadixflowError, match="dp_size"):
        ServerArgs(dp_size=0)


@pytest.fixture(scope="module")
def dp():
    pytest.importorskip("sglang_router")
    s = start_server(
        "--dp-size", "2", "--router-policy", "cache_aware", "--max-total-tokens", "4096", "--log-interval-s", "60",
        startup_timeout_s=600,  # two model loads at once on 2 shared cores
    )  # fmt: skip
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def replicas(log: str) -> dict[int, tuple[int, str]]:
    """index -> (pid, url) of each replica's latest start, from the supervisor's lines."""
    found = {}
    for m in re.finditer(r"^replica (\d+) \(pid (\d+)\) ready at (\S+)$", log, re.M):
        found[int(m.group(1))] = (int(m.group(2)), m.group(3))
    return found


def gen(client: httpx.Client, text: str, **extra) -> dict:
    params = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
    r = client.post("/generate", json={"text": text, "sampling_params": params, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_native_routes_through_the_router(dp):
    with dp.client() as c:
        out = gen(c, "The capital of France is")
        assert out["meta_info"]["completion_tokens"] == 4 and out["text"]
        r = c.post("/generate", json={"input_ids": [[1, 2, 3], [4, 5]], "sampling_params": {"max_new_tokens": 2}})
        assert r.status_code == 200 and len(r.json()) == 2
        events = []
        with c.stream("POST", "/generate", json={"text": "List three colors:", "stream": True,
                                                 "sampling_params": {"max_new_tokens": 3, "temperature": 0}}) as s:  # fmt: skip
            for line in s.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
        assert events[-1] == "[DONE]" and json.loads(events[-2])["meta_info"]["completion_tokens"] == 3
        assert c.get("/get_model_info").json()["is_generation"] is True
        assert c.post("/flush_cache").status_code == 200  # the router flushes every replica


def test_openai_routes_through_the_router(dp):
    """The router adds SGLang's fields (continue_final_message, return_hidden_states, ...) to what it forwards."""
    messages = [{"role": "user", "content": "Name a color."}]
    with dp.client() as c:
        r = c.post("/v1/completions", json={"model": "default", "prompt": "Hello", "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1
        r = c.post("/v1/chat/completions", json={"model": "default", "messages": messages, "max_tokens": 4, "n": 2})
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 2
        body = {"model": "default", "messages": messages, "max_tokens": 4, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        with c.stream("POST", "/v1/chat/completions", json=body) as s:
            assert s.status_code == 200, s.read()
            events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])
        assert text and chunks[-1]["usage"]["completion_tokens"] >= 1


def test_programs_run_eagerly_through_the_router(dp):
    """The router has no /program route: RuntimeEndpoint notices and runs programs through /generate."""
    import radixflow.lang as rl
    from radixflow.lang.backends.runtime_endpoint import RuntimeEndpoint

    @rl.function
    def two_steps(s):
        s += "Name a fruit:" + rl.gen("fruit", max_tokens=3, temperature=0)
        s += " and a color:" + rl.gen("color", max_tokens=3, temperature=0)

    backend = RuntimeEndpoint(dp.url, api_key=dp.api_key)
    try:
        assert backend.supports_graphs is False
        state = two_steps.run(backend=backend)
        assert state.mode == "eager" and state["fruit"] is not None and state["color"] is not None
    finally:
        backend.close()


def test_cache_aware_routing_reuses_the_prefix(dp):
    """The second request with a long shared prefix goes where the first one left its KV."""
    prefix = "Background for the questions below: " + " ".join(f"fact {i} is about topic {i % 7};" for i in range(60))
    with dp.client() as c:
        first = gen(c, prefix + " Question one?")
        second = gen(c, prefix + " Question two?")
    assert first["meta_info"]["prompt_tokens"] > 300
    assert second["meta_info"]["cached_tokens"] >= first["meta_info"]["prompt_tokens"] - 8


def test_replicas_report_load(dp):
    for _, url in replicas(dp.log()).values():
        with httpx.Client(base_url=url, headers=dp.headers, timeout=30) as c:
            load = c.get("/get_load").json()
            assert load == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]
            info = c.get("/get_server_info").json()
            assert info["served_model_name"] == "default" and info["dp_size"] == 1


def test_a_killed_replica_loses_no_request_and_restarts(dp):
    before = replicas(dp.log())
    assert sorted(before) == [0, 1]
    pid0, url0 = before[0]
    prompts = [f"Request {i}: say something about the number {i}." for i in range(16)]
    with dp.client() as c, cf.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(gen, c, p) for p in prompts[:4]]
        time.sleep(0.5)
        os.kill(pid0, signal.SIGKILL)  # some of those are running on it now
        futures += [pool.submit(gen, c, p) for p in prompts[4:]]
        outs = [f.result() for f in futures]  # gen asserts each one is a 200
    short = [o for o in outs if o["meta_info"]["completion_tokens"] != 4]
    assert not short, short
    deadline = time.time() + RESTART_TIMEOUT_S
    while replicas(dp.log())[0][0] == pid0:
        assert time.time() < deadline, dp.log()[-3000:]
        time.sleep(0.5)
    assert "replica 0 exited (killed by SIGKILL); restarting it" in dp.log()
    pid, url = replicas(dp.log())[0]
    assert url == url0 and pid != pid0
    with httpx.Client(base_url=url, headers=dp.headers, timeout=60) as c:
        assert gen(c, "The restarted replica serves too:")["meta_info"]["completion_tokens"] == 4
