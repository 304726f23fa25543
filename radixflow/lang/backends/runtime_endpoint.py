"""Programs on a radixflow server, through its native API (/generate, /program,
/get_model_info, /flush_cache). Works with SGLang-style servers for eager runs."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Optional

from radixflow.errors import RadixflowError
from radixflow.lang.backends.base import NativeBackend
from radixflow.lang.backends.http_util import check, client, sse_events

MAX_PARALLEL_PROGRAMS = 128


class RuntimeEndpoint(NativeBackend):
    def __init__(self, base_url: str, api_key: Optional[str] = None, verify=None, chat_template_name: Optional[str] = None,
                 *, timeout: float = 600.0):
        """SGLang's arguments: verify (TLS checks, as httpx's `verify`); chat_template_name only as None: roles
        render with the server's chat template (the model's, or its --chat-template)."""
        if chat_template_name is not None:
            raise RadixflowError(f"chat_template_name={chat_template_name!r}: radixflow renders roles with the server's "
                                 "chat template (start the server with --chat-template FILE); leave it out")
        self.base_url = base_url.rstrip("/")
        self.client = client(self.base_url, api_key, timeout, verify)
        self.model_info = check(self.client.get("/get_model_info"), "GET /get_model_info").json()
        self.tokenizer = _local_tokenizer(self.model_info.get("tokenizer_path"))
        if self.tokenizer is not None and self.model_info.get("chat_template"):  # the server's --chat-template
            self.tokenizer.chat_template = self.model_info["chat_template"]
        # A router in front (sglang-router) forwards /generate but has no /program route: then
        # programs run eagerly, one /generate call at a time, instead of as request graphs.
        self.supports_graphs = self.streams_graphs = self.client.get("/program").status_code != 404

    def get_model_name(self) -> str:
        return self.model_info["model_path"]

    def _call(self, payload: dict):
        return check(self.client.post("/generate", json=payload), "POST /generate").json()

    def _call_stream(self, payload: dict) -> Iterator[dict]:
        with self.client.stream("POST", "/generate", json={**payload, "stream": True}) as r:
            if r.status_code >= 400:
                r.read()
                check(r, "POST /generate")
            yield from sse_events(r)

    def run_graphs(self, programs: list, on_result: Optional[Callable[[int, dict], None]] = None) -> list:
        def one(i: int) -> dict:
            try:
                out = check(self.client.post("/program", json={"program": programs[i]}), "POST /program").json()
            except RadixflowError as e:  # this program's alone: the others run on
                out = {"error": str(e)}
            if on_result is not None:
                on_result(i, out)
            return out

        if len(programs) == 1:
            return [one(0)]
        with ThreadPoolExecutor(min(len(programs), MAX_PARALLEL_PROGRAMS)) as pool:
            return list(pool.map(one, range(len(programs))))

    def run_graph_stream(self, program: dict) -> Iterator[dict]:
        with self.client.stream("POST", "/program", json={"program": program, "stream": True}) as r:
            if r.status_code >= 400:
                r.read()
                check(r, "POST /program")
            yield from sse_events(r)

    def flush_cache(self) -> bool:
        return self.client.post("/flush_cache").status_code == 200

    def start_profile(self) -> None:
        """SGLang's: the server's torch profiler on (POST /start_profile, its defaults)."""
        check(self.client.post("/start_profile"), "POST /start_profile")

    def stop_profile(self) -> None:
        """SGLang's: the profile stopped and its trace written (the server logs and answers where)."""
        check(self.client.post("/stop_profile"), "POST /stop_profile")

    def get_server_info(self) -> dict:
        return check(self.client.get("/get_server_info"), "GET /get_server_info").json()

    def metrics(self) -> str:
        return check(self.client.get("/metrics"), "GET /metrics").text

    def close(self) -> None:
        self.client.close()


def _local_tokenizer(path: Optional[str]):
    """The model's tokenizer if this machine has it (then programs send token ids)."""
    if not path or not os.path.isdir(path):
        return None
    try:
        from radixflow.model_files import load_tokenizer

        return load_tokenizer(path)
    except Exception:
        return None
