"""Process lifecycle: a dead child takes the server down fast and loudly; signals shut
everything down; a bad model path fails at start-up with the reason."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import httpx
from serving_helpers import start_server

SMALL = ("--max-total-tokens", "4096", "--max-running-requests", "8")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_kill_scheduler_exits_server_fast():
    server = start_server(*SMALL, api_key=None)
    try:
        info = server.info()
        sched, detok = info["scheduler_pid"], info["detokenizer_pid"]
        result: dict = {}

        def stream():  # an open stream must end too, not hang
            body = {"text": "Go on forever:", "stream": True, "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
            try:
                with httpx.stream("POST", server.url + "/generate", json=body, timeout=60) as r:
                    result["lines"] = [line for line in r.iter_lines() if line]
            except httpx.HTTPError as e:
                result["exc"] = e

        t = threading.Thread(target=stream)
        t.start()
        time.sleep(1.0)
        t0 = time.time()
        subprocess.run(["kill", "-9", str(sched)], check=True)
        code = server.proc.wait(timeout=10)
        elapsed = time.time() - t0
        t.join(10)
    finally:
        server.stop()
    assert code != 0 and elapsed < 10
    assert "scheduler process died (killed by SIGKILL)" in server.log()
    assert not t.is_alive()
    assert "exc" in result or "scheduler process died" in " ".join(result.get("lines", []))
    time.sleep(1)
    assert not alive(detok), "the detokenizer was orphaned"


def test_sigterm_shuts_down_cleanly():
    """Requests still running get a 503 with a JSON error (a stream: its error event) before the graceful period
    ends; uvicorn's cancel gave them a plain-text 500 (fuzzing, session 29)."""
    server = start_server(*SMALL, api_key=None)
    info = server.info()
    got: dict = {}

    def call(stream: bool) -> None:
        body = {"text": "Go on forever:", "stream": stream, "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
        with httpx.stream("POST", server.url + "/generate", json=body, timeout=60) as r:
            got[stream] = (r.status_code, r.read().decode())

    threads = [threading.Thread(target=call, args=(stream,)) for stream in (False, True)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(timeout=20)
    for t in threads:
        t.join(10)
    assert code == 0, server.log()[-2000:]
    time.sleep(1)
    assert not alive(info["scheduler_pid"]) and not alive(info["detokenizer_pid"])
    assert got[False][0] == 503 and "shutting down" in json.loads(got[False][1])["error"]["message"]
    assert got[True][0] == 200 and '"error"' in got[True][1] and "shutting down" in got[True][1]


def test_bad_model_path_fails_with_reason():
    r = subprocess.run([sys.executable, "-m", "radixflow", "serve", "--model-path", "/no/such/model", "--port", "1"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode != 0
    assert "does not exist" in r.stderr and "failed to start" in r.stderr
