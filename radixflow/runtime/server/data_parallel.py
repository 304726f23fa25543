"""`radixflow serve --dp-size N`: N replicas of the server on this host behind sglang-router.

This process is a supervisor. It starts each replica as its own `radixflow serve` on a free
local port (on GPUs, replica i gets GPUs i*tp_size .. (i+1)*tp_size-1), waits until every one
answers /health, then starts the router (`python -m sglang_router.launch_router`) on
--host/--port with the replicas' URLs and the --router-policy. Clients talk to the router only.

A replica that exits is started again on the same port (after a short back-off); meanwhile the
router's retries and health checks send its traffic to the others. If the router exits, or on
SIGINT / SIGTERM, everything is stopped. Replica and router output is echoed with a prefix.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

import httpx

from radixflow.runtime.child_processes import exit_text, free_port
from radixflow.runtime.server_args import ServerArgs

POLL_S = 0.5
STARTUP_TIMEOUT_S = 600
RESTART_BACKOFF_S = (1, 2, 5, 10, 30)
STOP_TIMEOUT_S = 15
# A dead replica must leave the rotation within a request's retries, not after the router's
# default 10 failures or 60 s health period: cache_aware keeps choosing the replica that holds a
# prompt's prefix, so every retry would go to the dead one. Three failed sends open its circuit
# (the retries then go elsewhere); health checks every 2 s bring it back once restarted. A dead
# replica refuses connections at once, so the check's timeout can be long: a busy replica on a
# loaded machine may take seconds to answer and is not dead. The user's --router-args come later
# on the command line and win.
ROUTER_DEFAULT_FLAGS = (
    "--cb-failure-threshold", "3", "--cb-timeout-duration-secs", "5", "--health-check-interval-secs", "2",
    "--health-failure-threshold", "2", "--health-check-timeout-secs", "15", "--log-level", "warn",
)  # fmt: skip


class SupervisorError(RuntimeError):
    pass


@dataclass
class Replica:
    index: int
    port: int
    env: dict
    proc: Optional[subprocess.Popen] = None
    ready: bool = False
    restarts: int = 0
    failures: int = 0  # exits since it last became ready: picks the back-off
    restart_at: Optional[float] = None  # set while waiting to start again

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Supervisor:
    args: ServerArgs
    replicas: list[Replica] = field(default_factory=list)
    router: Optional[subprocess.Popen] = None
    stop_signal: Optional[int] = None

    # -- start ---------------------------------------------------------------------------------
    def start_replica(self, r: Replica) -> None:
        argv = self.args.to_cli(host="127.0.0.1", port=r.port, dp_size=1, router_policy=None, router_args=None)
        r.proc = _spawn([sys.executable, "-m", "radixflow", "serve", *argv], r.env, f"replica {r.index}")
        r.ready, r.restart_at = False, None

    def wait_all_ready(self) -> None:
        deadline = time.time() + STARTUP_TIMEOUT_S
        while not all(r.ready for r in self.replicas):
            if self.stop_signal is not None:
                return
            for r in self.replicas:
                if r.proc.poll() is not None:
                    raise SupervisorError(f"replica {r.index} exited while starting ({exit_text(r.proc.returncode)})")
                self.check_ready(r)
            if time.time() > deadline:
                raise SupervisorError(f"the replicas did not answer /health within {STARTUP_TIMEOUT_S} s")
            time.sleep(POLL_S)

    def check_ready(self, r: Replica) -> None:
        if not r.ready and _healthy(r.url):
            r.ready, r.failures = True, 0
            _say(f"replica {r.index} (pid {r.proc.pid}) ready at {r.url}")

    def start_router(self) -> None:
        if importlib.util.find_spec("sglang_router") is None:
            raise SupervisorError("--dp-size needs the router: pip install sglang-router")
        a = self.args
        cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *(r.url for r in self.replicas)]
        cmd += ["--policy", a.router_policy, "--host", a.host, "--port", str(a.port)]
        cmd += ["--prometheus-port", str(free_port()), *ROUTER_DEFAULT_FLAGS]
        if a.api_key:
            cmd += ["--api-key", a.api_key]
        cmd += shlex.split(a.router_args or "")
        self.router = _spawn(cmd, dict(os.environ), "router")
        deadline = time.time() + STARTUP_TIMEOUT_S
        url = f"http://{_client_host(a.host)}:{a.port}"
        while not _healthy(url):
            if self.router.poll() is not None:
                raise SupervisorError(f"the router exited while starting ({exit_text(self.router.returncode)})")
            if time.time() > deadline or self.stop_signal is not None:
                raise SupervisorError("the router did not answer /health")
            time.sleep(POLL_S)

    # -- supervise -----------------------------------------------------------------------------
    def watch(self) -> int:
        while self.stop_signal is None:
            if self.router.poll() is not None:
                _say(f"the router exited ({exit_text(self.router.returncode)}); stopping the replicas", err=True)
                return 1
            for r in self.replicas:
                self.tend(r)
            time.sleep(POLL_S)
        return 0

    def tend(self, r: Replica) -> None:
        now = time.time()
        if r.restart_at is not None:
            if now >= r.restart_at:
                r.restarts += 1
                self.start_replica(r)
                _say(f"replica {r.index} restarting (pid {r.proc.pid}, restart {r.restarts})")
            return
        if r.proc.poll() is None:
            self.check_ready(r)
            return
        delay = RESTART_BACKOFF_S[min(r.failures, len(RESTART_BACKOFF_S) - 1)]
        r.failures += 1
        _say(f"replica {r.index} exited ({exit_text(r.proc.returncode)}); restarting it in {delay} s", err=True)
        r.ready, r.restart_at = False, now + delay

    def stop(self) -> None:
        procs = [p for p in [self.router, *(r.proc for r in self.replicas)] if p is not None]
        for p in procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.time() + STOP_TIMEOUT_S
        for p in procs:
            try:
                p.wait(max(deadline - time.time(), 0.1))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def run_data_parallel(args: ServerArgs) -> int:
    """Runs the replicas and the router until shut down; returns the exit status."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per health poll
    sup = Supervisor(args)

    def on_signal(signum, frame):
        sup.stop_signal = signum

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        sup.replicas = [Replica(i, port, env) for i, (port, env) in enumerate(zip(_ports(args), replica_envs(args)))]
        for r in sup.replicas:
            sup.start_replica(r)
        sup.wait_all_ready()
        if sup.stop_signal is not None:
            return 0
        sup.start_router()
        _say(
            f"radixflow server ready at http://{args.host}:{args.port} (sglang-router, {args.dp_size} replicas, "
            f"policy {args.router_policy}, pid {os.getpid()})"
        )
        return sup.watch()
    except SupervisorError as e:
        _say(f"radixflow: server failed to start: {e}", err=True)
        return 1
    finally:
        sup.stop()


def replica_envs(args: ServerArgs) -> list[dict]:
    """Each replica's environment: its own GPUs on CUDA; a share of the CPU threads on CPU."""
    base = dict(os.environ)
    if args.resolved_device() == "cuda":
        import torch

        visible = base.get("CUDA_VISIBLE_DEVICES")
        gpus = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
        need = args.dp_size * args.tp_size
        if len(gpus) < need:
            raise SupervisorError(
                f"dp_size {args.dp_size} x tp_size {args.tp_size} needs {need} GPUs; {len(gpus)} are visible"
            )
        tp = args.tp_size
        return [{**base, "CUDA_VISIBLE_DEVICES": ",".join(gpus[i * tp : (i + 1) * tp])} for i in range(args.dp_size)]
    threads = str(max(1, (os.cpu_count() or 1) // args.dp_size))
    return [{"OMP_NUM_THREADS": threads, **base} for _ in range(args.dp_size)]


def _ports(args: ServerArgs) -> list[int]:
    ports: list[int] = []
    while len(ports) < args.dp_size:
        port = free_port()
        if port not in ports and port != args.port:
            ports.append(port)
    return ports


def _spawn(cmd: list[str], env: dict, name: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        preexec_fn=_die_with_parent,
    )  # fmt: skip
    threading.Thread(target=_echo, args=(proc, name), daemon=True).start()
    return proc


def _echo(proc: subprocess.Popen, name: str) -> None:
    for line in iter(proc.stdout.readline, b""):
        sys.stdout.write(f"[{name}] {line.decode(errors='replace')}")
        sys.stdout.flush()


def _die_with_parent() -> None:
    """Linux: the child gets SIGTERM if the supervisor dies (even by SIGKILL), so no orphans stay."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def _say(msg: str, err: bool = False) -> None:
    print(msg, file=sys.stderr if err else sys.stdout, flush=True)
