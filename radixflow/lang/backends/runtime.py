"""`rf.Runtime`: starts a local `radixflow serve` process and talks to it through a
RuntimeEndpoint (`.endpoint`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, AsyncIterator, Optional, Union

import httpx

from radixflow.errors import RadixflowError
from radixflow.lang.backends.http_util import async_sse_events, auth_headers, check
from radixflow.lang.backends.runtime_endpoint import RuntimeEndpoint
from radixflow.runtime.child_processes import free_port


class Runtime:
    def __init__(self, model_path: Optional[str] = None, launch_timeout: float = 300.0, **server_args: Any):
        self.port = server_args.pop("port", None) or free_port()
        self.api_key = server_args.get("api_key")
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "radixflow", "serve", "--port", str(self.port)]
        if model_path:
            cmd += ["--model-path", model_path]
        cmd += _cli(server_args)
        fd, self.log_path = tempfile.mkstemp(prefix="radixflow-runtime-", suffix=".log")
        self.process = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT)
        os.close(fd)
        self._failed = False
        try:
            self._wait_ready(launch_timeout)
        except BaseException:
            self._failed = True  # its log stays for the reader
            self.shutdown()
            raise
        self.endpoint = RuntimeEndpoint(self.url, self.api_key)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.time() + timeout
        headers = auth_headers(self.api_key)
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RadixflowError(f"the server exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/health", headers=headers, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RadixflowError(f"the server did not start within {timeout:.0f}s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def shutdown(self) -> None:
        """Stops the server; its log file (`log_path`) is removed unless the server failed."""
        if getattr(self, "endpoint", None) is not None:
            self.endpoint.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        if self.process.returncode in (0, -signal.SIGTERM) and not self._failed:
            with contextlib.suppress(OSError):
                os.unlink(self.log_path)

    @property
    def token_usage(self):
        return self.endpoint.token_usage

    def flush_cache(self) -> bool:
        return self.endpoint.flush_cache()

    def get_server_info(self) -> dict:
        return self.endpoint.get_server_info()

    def get_tokenizer(self):
        """The served model's tokenizer (transformers'), loaded from the server's tokenizer folder."""
        if self.endpoint.tokenizer is None:
            raise RadixflowError("the server's tokenizer folder cannot be read from this process")
        return self.endpoint.tokenizer

    def cache_prefix(self, prefix: str) -> bool:
        """Prefill `prefix` so that later requests find it in the radix cache."""
        return self.endpoint.cache_prefix(prefix)

    def generate(self, prompt: Union[str, list], sampling_params: Optional[dict] = None, return_logprob: bool = False,
                 logprob_start_len: Optional[int] = None, top_logprobs_num: Optional[int] = None) -> str:
        """SGLang's Runtime.generate: one POST /generate; its JSON response as a string."""
        payload = {"text": prompt, "sampling_params": sampling_params or {}, "return_logprob": return_logprob}
        optional = {"logprob_start_len": logprob_start_len, "top_logprobs_num": top_logprobs_num}
        payload.update({k: v for k, v in optional.items() if v is not None})
        return json.dumps(self.endpoint._call(payload))

    async def async_generate(self, prompt: str, sampling_params: Optional[dict] = None) -> AsyncIterator[str]:
        """SGLang's Runtime.async_generate: the text as it streams, each piece once (`async for piece in ...`)."""
        headers = auth_headers(self.api_key)
        body = {"text": prompt, "sampling_params": sampling_params or {}, "stream": True}
        sent = 0
        async with httpx.AsyncClient(base_url=self.url, headers=headers, timeout=600) as c:
            async with c.stream("POST", "/generate", json=body) as r:
                if r.status_code >= 400:
                    await r.aread()
                    check(r, "POST /generate")
                async for event in async_sse_events(r):
                    piece = event.get("text", "")[sent:]
                    sent += len(piece)
                    if piece:
                        yield piece

    add_request = async_generate  # SGLang's other name

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def _cli(server_args: dict) -> list[str]:
    out = []
    for k, v in server_args.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            out.append(flag)
        elif v is not None and v is not False:
            out += [flag, str(v)]
    return out
