"""Concurrency, aborts, disconnects and failing requests: KV is always given back."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from conftest import SERVER_FAULT_PREFIX
from serving_helpers import wait_idle

LONG = {"max_new_tokens": 2000, "ignore_eos": True, "temperature": 0}


def assert_no_leak(info: dict) -> None:
    assert info["num_inflight_reqs"] == 0 and info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0, info
    assert info["request_slots"] == 0, info  # only the radix tree may hold slots once idle
    assert info["locked_cached_slots"] == 0, info
    assert info["free_slots"] + info["cached_slots"] == info["max_total_num_tokens"], info


def wait_running(server, rid_count: int = 1, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while server.info()["num_running_reqs"] < rid_count:
        assert time.time() < deadline, "request never started running"
        time.sleep(0.1)


async def _stream_one(client: httpx.AsyncClient, i: int) -> dict:
    # a shared head keeps prefill small (the radix cache serves it); the tail differs per request
    body = {"text": f"The weather report for today, number {i}", "stream": True,
            "sampling_params": {"max_new_tokens": 3, "temperature": 0.7, "sampling_seed": i}}  # fmt: skip
    last, done = None, False
    async with client.stream("POST", "/generate", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                last = json.loads(line[6:])
                assert "error" not in last, last
    assert done and last["meta_info"]["finish_reason"] is not None
    return last


def test_200_concurrent_streams_no_leak(server):
    async def run() -> list:
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=600, limits=limits) as c:
            return await asyncio.gather(*(_stream_one(c, i) for i in range(200)))

    outs = asyncio.run(run())
    assert len(outs) == 200
    assert all(o["meta_info"]["completion_tokens"] >= 1 for o in outs)
    assert len({o["meta_info"]["id"] for o in outs}) == 200
    assert_no_leak(wait_idle(server))


def _generate_in_thread(server, body: dict, out: dict) -> threading.Thread:
    def go():
        with server.client(timeout=600) as c:
            r = c.post("/generate", json=body)
            out["status"], out["body"] = r.status_code, r.json()

    t = threading.Thread(target=go)
    t.start()
    return t


def test_abort_request_frees_kv(server):
    out: dict = {}
    t = _generate_in_thread(server, {"text": "Tell me a very long story.", "rid": "abort-me", "sampling_params": LONG}, out)
    wait_running(server)
    with server.client() as c:
        assert c.post("/abort_request", json={"rid": "abort-me"}).status_code == 200
        assert c.post("/abort_request", json={}).status_code == 400
    t.join(60)
    assert out["status"] == 200 and out["body"]["meta_info"]["finish_reason"]["type"] == "abort"
    assert out["body"]["meta_info"]["completion_tokens"] < 2000
    assert_no_leak(wait_idle(server))


@pytest.mark.parametrize("body", [{"text": "Tell me a long story.", "sampling_params": dict(LONG, n=2)},
                                  {"text": ["Story one:", "Story two:"], "sampling_params": LONG}])
def test_abort_by_the_rid_the_call_was_sent_with(server, body):
    """n > 1 and a batch run as several requests (rid-j, rid_i): aborting the call's own rid stops them all (found
    by fuzzing: it stopped none), and the rid stays taken while they run."""
    out: dict = {}
    t = _generate_in_thread(server, {**body, "rid": "group-me"}, out)
    wait_running(server, 2)
    with server.client() as c:
        taken = c.post("/generate", json={"text": "x", "rid": "group-me", "sampling_params": {"max_new_tokens": 1}})
        assert c.post("/abort_request", json={"rid": "group-me"}).status_code == 200
    t.join(60)
    assert taken.status_code == 400 and "already in use" in taken.json()["error"]["message"]
    assert out["status"] == 200 and [o["meta_info"]["finish_reason"]["type"] for o in out["body"]] == ["abort", "abort"]
    assert_no_leak(wait_idle(server))


def test_abort_all(server):
    out: dict = {}
    t = _generate_in_thread(server, {"text": ["Story one:", "Story two:"], "sampling_params": LONG}, out)
    wait_running(server, 2)
    with server.client() as c:
        c.post("/abort_request", json={"abort_all": True})
    t.join(60)
    assert [o["meta_info"]["finish_reason"]["type"] for o in out["body"]] == ["abort", "abort"]
    assert_no_leak(wait_idle(server))


def test_stream_disconnect_frees_kv(server):
    body = {"text": "Write an endless poem.", "stream": True, "sampling_params": LONG}
    with server.client() as c, c.stream("POST", "/generate", json=body) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen == 2:
                break  # leaving the block closes the connection mid-stream
    t0 = time.time()
    info = wait_idle(server, timeout=30)
    assert time.time() - t0 < 30
    assert_no_leak(info)


def test_a_rid_reused_right_after_its_client_left_gets_none_of_the_old_reports(server):
    """A stream with a rid, left after its first chunk, then the same body again at once: the old request's reports
    reached the new one (its stream ended early), and with reports as deltas they broke the loop that delivers every
    output (the server answered nothing more: fuzzing, session 29). The rid is now in use until the old request's last
    report; a retry then runs in full."""
    body = {"text": "Tell me about the ocean.", "rid": "reuse-1", "stream": True, "return_logprob": True,
            "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}}  # fmt: skip
    with server.client() as c:
        with c.stream("POST", "/generate", json=body) as r:
            next(line for line in r.iter_lines() if line.startswith("data: "))
        for _ in range(100):
            with c.stream("POST", "/generate", json=body) as r:
                r.read()
            if r.status_code == 200:
                break
            assert r.status_code == 400 and "already in use" in r.text
            time.sleep(0.05)
        events = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
        assert events[-1]["meta_info"]["finish_reason"]["type"] == "length" and len(events[-1]["output_ids"]) == 24
        ok = c.post("/generate", json={"text": "still alive?", "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}})
        assert ok.status_code == 200
    assert_no_leak(wait_idle(server))


def test_nonstream_disconnect_frees_kv(server):
    with server.client(timeout=3) as c, pytest.raises(httpx.ReadTimeout):
        c.post("/generate", json={"text": "Another endless poem.", "sampling_params": LONG})
    assert_no_leak(wait_idle(server, timeout=30))


def test_failing_request_gets_500_and_server_goes_on(server):
    with server.client() as c:
        r = c.post("/generate", json={"text": "boom", "rid": SERVER_FAULT_PREFIX + "1", "sampling_params": {"max_new_tokens": 3}})
        assert r.status_code == 500 and "injected fault" in r.json()["error"]["message"]
        body = {"text": "boom", "rid": SERVER_FAULT_PREFIX + "2", "stream": True, "sampling_params": {"max_new_tokens": 3}}
        with c.stream("POST", "/generate", json=body) as s:
            lines = [x for x in s.iter_lines() if x]
        assert "injected fault" in json.loads(lines[-2][6:])["error"]["message"] and lines[-1] == "data: [DONE]"
        ok = c.post("/generate", json={"text": "still alive?", "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}})
        assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 2
    assert_no_leak(wait_idle(server))


def test_duplicate_rid_rejected(server):
    out: dict = {}
    t = _generate_in_thread(server, {"text": "Long one", "rid": "dup", "sampling_params": LONG}, out)
    wait_running(server)
    with server.client() as c:
        r = c.post("/generate", json={"text": "again", "rid": "dup"})
        c.post("/abort_request", json={"rid": "dup"})
    t.join(60)
    assert r.status_code == 400 and "already in use" in r.json()["error"]["message"]
    assert_no_leak(wait_idle(server))


def test_concurrent_calls_with_one_rid_get_one_answer_each(server):
    """Sent at once, calls sharing a rid all passed the check before any took it, and all but one waited forever."""

    async def one(c: httpx.AsyncClient, i: int):
        body = {"text": "Hello", "rid": "same-rid", "sampling_params": {"max_new_tokens": 2}}
        path, body = ("/generate", body) if i % 2 else ("/v1/chat/completions", {
            "model": "default", "rid": "same-rid", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
        return await c.post(path, json=body)

    async def main():
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=60) as c:
            return await asyncio.gather(*(one(c, i) for i in range(10)))

    codes = sorted(r.status_code for r in asyncio.run(main()))
    assert codes[0] == 200 and set(codes) <= {200, 400} and codes.count(400) >= 1, codes
    assert_no_leak(wait_idle(server))


def test_calls_over_max_batch_size_are_refused_before_any_request_is_made(server):
    """prompts x n was expanded (and every prompt tokenized) before the count was checked: a huge n held the
    event loop for seconds and grew the server by a gigabyte before its 400."""
    calls = [("/generate", {"text": "hi", "sampling_params": {"n": 10**6, "max_new_tokens": 1}}),
             ("/generate", {"text": ["hi"] * 10**4, "sampling_params": {"max_new_tokens": 1}}),
             ("/v1/completions", {"model": "default", "prompt": "hi", "n": 10**6, "max_tokens": 1})]  # fmt: skip
    with server.client() as c:
        for path, body in calls:
            t = time.perf_counter()
            r = c.post(path, json=body)
            assert r.status_code == 400 and "--max-batch-size" in r.json()["error"]["message"], r.text
            assert time.perf_counter() - t < 3, path


def test_a_client_gone_while_sending_its_body_leaves_no_traceback(server):
    import socket
    from urllib.parse import urlparse

    url = urlparse(server.url)
    before = server.log().count("Traceback")
    with socket.create_connection((url.hostname, url.port)) as s:
        head = (f"POST /generate HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
                f"Content-Length: 1000\r\nAuthorization: Bearer {server.api_key}\r\n\r\n")  # fmt: skip
        s.sendall(head.encode() + b'{"text": "par')
    time.sleep(1.0)
    assert server.log().count("Traceback") == before, server.log()[-2000:]
    with server.client() as c:
        assert c.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}}).status_code == 200


def test_an_abandoned_request_whose_last_report_never_comes_is_forgotten(monkeypatch):
    """A request whose caller left stays in `pending` (its rid in use) until its last report. Were that report never
    to come, only a reuse of that very rid cleared it (review, session 29): every call now sweeps such entries once
    ABANDONED_KEEP_S has passed, and a last report that does come takes its entry out of the sweep."""
    import asyncio

    from radixflow.runtime.scheduling.req import ReqOutput
    from radixflow.runtime.server import tokenizer_manager as tm_module
    from radixflow.runtime.server.server_messages import DetokBatch

    tm = object.__new__(tm_module.TokenizerManager)  # no sockets or tokenizer: the bookkeeping alone
    tm.pending, tm.abandoned, tm.groups, sent = {}, {}, {}, []
    tm.send = sent.append
    for rid in ("old", "answered", "new"):
        tm.pending[rid] = tm_module.Pending(rid, 0, asyncio.Queue(), 0.0, None)
    tm._abort_unfinished(["old", "answered"])
    last = ReqOutput("answered", [], True, {"type": "abort"}, 1, 0)
    tm._dispatch(DetokBatch([last], [""]))  # its last report: the rid is free
    tm.pending["old"].abandoned -= tm_module.ABANDONED_KEEP_S + 1
    tm._abort_unfinished(["new"])
    assert set(tm.pending) == {"new"} and list(tm.abandoned) == ["new"]
    assert [a.rid for a in sent] == ["old", "answered", "new"]  # each aborted once, when its caller left


def test_a_request_failed_in_delivery_frees_its_rid_at_its_last_report():
    """A request the delivery loop failed (its `done` set there) ignored its later reports, so its last one never
    counted and its rid stayed blocked for ABANDONED_KEEP_S once its call ended (review, session 30)."""
    import asyncio

    from radixflow.runtime.scheduling.req import ReqOutput
    from radixflow.runtime.server import tokenizer_manager as tm_module
    from radixflow.runtime.server.server_messages import DetokBatch

    tm = object.__new__(tm_module.TokenizerManager)
    tm.pending, tm.abandoned, tm.groups, sent = {}, {}, {}, []
    tm.send = sent.append
    tm.pending["r"] = tm_module.Pending("r", 0, asyncio.Queue(), 0.0, None, done=True)  # failed by the delivery
    tm._dispatch(DetokBatch([ReqOutput("r", [], True, {"type": "abort"}, 1, 0)], [""]))
    tm._abort_unfinished(["r"])
    assert "r" not in tm.pending and not tm.abandoned and not sent


def test_a_request_its_detokenizer_failed_keeps_its_rid_until_its_last_report():
    """A decode that raised marked the report finished, so the caller's rid was free at once while the scheduler
    still ran the request and sent its reports (review, session 30): the report now carries only the error; the
    caller gets it (500) and the scheduler an abort, and the rid is free at the scheduler's last report."""
    import asyncio

    from radixflow.runtime.scheduling.req import LogprobOptions, ReqOutput
    from radixflow.runtime.server import tokenizer_manager as tm_module
    from radixflow.runtime.server.detokenizer import Detokenizer, _handle
    from radixflow.runtime.server.server_messages import DetokBatch, OutputBatch

    class BrokenTokenizer:
        def decode(self, ids, skip_special_tokens=True):
            raise ValueError("no text for these ids")

    batch = _handle(Detokenizer(BrokenTokenizer()), OutputBatch([ReqOutput("r", [5], False, None, 1, 0)]))
    assert not batch.outputs[0].finished and "no text for these ids" in batch.outputs[0].error
    tm = object.__new__(tm_module.TokenizerManager)
    tm.pending, tm.abandoned, tm.groups, sent = {}, {}, {}, []
    tm.send, tm.args, tm.metrics = sent.append, type("Args", (), {"log_requests_level": 0})(), _NoMetrics()
    queue = asyncio.Queue()
    tm.pending["r"] = tm_module.Pending("r", 0, queue, 0.0, LogprobOptions())
    tm._dispatch(batch)
    event = queue.get_nowait()
    assert event.finished and event.status_code == 500 and "while decoding" in event.error
    assert [a.rid for a in sent] == ["r"]
    tm._abort_unfinished(["r"])
    assert "r" in tm.pending  # the scheduler may still report it
    tm._dispatch(DetokBatch([ReqOutput("r", [5], True, {"type": "abort"}, 1, 0)], [""]))
    assert "r" not in tm.pending and not tm.abandoned


class _NoMetrics:
    def on_tokens(self, *args) -> None:
        pass

    def on_finish(self, *args) -> None:
        pass
