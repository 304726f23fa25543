"""Start and stop a real `radixflow serve` process for tests."""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Optional

import httpx

from radixflow.runtime.child_processes import free_port

API_KEY = "test-key-123"
READY_LINE = "radixflow server ready at"
STARTUP_TIMEOUT_S = 240


@dataclass
class ServerProc:
    proc: subprocess.Popen
    url: str
    log_path: str
    api_key: Optional[str]

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=kw.pop("timeout", 120), **kw)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def info(self) -> dict:
        with self.client() as c:
            r = c.get("/get_server_info")
            r.raise_for_status()
            return r.json()

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def start_server(
    *extra: str, api_key: Optional[str] = API_KEY, env: Optional[dict] = None, startup_timeout_s: float = STARTUP_TIMEOUT_S
) -> ServerProc:
    port = free_port()
    log_fd, log_path = tempfile.mkstemp(prefix="radixflow-server-", suffix=".log")
    atexit.register(_remove, log_path)  # kept while the test process runs (a failure's message reads it): no leftovers
    cmd = [sys.executable, "-m", "radixflow", "serve", "--port", str(port), *extra]
    if api_key:
        cmd += ["--api-key", api_key]
    proc = subprocess.Popen(cmd, stdout=log_fd, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    os.close(log_fd)
    server = ServerProc(proc, f"http://127.0.0.1:{port}", log_path, api_key)
    deadline = time.time() + startup_timeout_s
    while not _ready(server.log()):
        if proc.poll() is not None or time.time() > deadline:
            server.stop()
            raise RuntimeError(f"server did not start (exit {proc.returncode}):\n{server.log()[-4000:]}")
        time.sleep(0.2)
    return server


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _ready(log: str) -> bool:
    # at a line's start: under --dp-size the replicas' own ready lines come prefixed with "[replica i]"
    return log.startswith(READY_LINE) or ("\n" + READY_LINE) in log


def wait_idle(server: ServerProc, timeout: float = 60) -> dict:
    """Server info once no request is running or queued (aborts are asynchronous)."""
    deadline = time.time() + timeout
    while True:
        info = server.info()
        busy = info["num_inflight_reqs"] + info["num_running_reqs"] + info["num_waiting_reqs"] + info["num_running_programs"]
        if busy == 0:
            return info
        if time.time() > deadline:
            return info
        time.sleep(0.1)
