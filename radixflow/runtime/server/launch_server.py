"""Starts the server: the scheduler and detokenizer processes, then the HTTP server
(FastAPI on uvicorn) with the TokenizerManager in this process.

SIGINT / SIGTERM shut everything down. If a child process dies, every open request
fails with the reason, and the server exits with status 1 within seconds.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import shutil
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from radixflow.runtime.child_processes import exit_text as _exit_text
from radixflow.runtime.child_processes import stop_processes
from radixflow.runtime.server_args import ServerArgs
from radixflow.runtime.server.server_messages import IpcNames, ModelInfo

log = logging.getLogger("radixflow.server")

WATCH_PERIOD_S = 0.5
GRACEFUL_SHUTDOWN_S = 3
# Idle connections are kept this long (uvicorn's default is 5 s, the same as httpx's and the OpenAI SDK's client
# expiry: a client reusing a connection just as the server closed it got "Server disconnected").
KEEP_ALIVE_S = 65
CHILD_JOIN_S = 5


class StartupError(RuntimeError):
    pass


def launch_server(args: ServerArgs) -> int:
    """Runs until shut down; returns the process exit status."""
    logging.basicConfig(level=args.log_level.upper(), format="[%(asctime)s server] %(message)s")
    if args.dp_size > 1:  # replicas behind sglang-router, supervised by this process
        from radixflow.runtime.server.data_parallel import run_data_parallel

        return run_data_parallel(args)
    if args.node_rank > 0:  # only node 0 serves HTTP; the others run their tensor-parallel ranks
        from radixflow.runtime.distributed.tp_launch import run_worker_node

        return run_worker_node(args)
    ipc = IpcNames.fresh()
    procs: dict = {}
    stop = _install_signal_handlers()
    try:
        info, tokenizer = _start_children(args, ipc, procs)
        if stop["signal"]:
            return 0
        return asyncio.run(_serve(args, info, tokenizer, ipc, procs, stop))
    except StartupError as e:
        print(f"radixflow: server failed to start: {e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop_processes(procs, CHILD_JOIN_S, terminate=True)
        shutil.rmtree(ipc.directory, ignore_errors=True)


def _install_signal_handlers() -> dict:
    """SIGINT/SIGTERM: stop starting (while loading) or stop serving (uvicorn takes over
    while it runs and calls these again once it has shut down)."""
    stop = {"signal": None}

    def handler(signum, frame):
        first = stop["signal"] is None
        stop["signal"] = signum
        if first and not stop.get("serving"):
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


def _start_children(args: ServerArgs, ipc: IpcNames, procs: dict) -> tuple[ModelInfo, Any]:
    """Start the scheduler and the detokenizer; returns the model's info and its tokenizer (None: not loaded yet).
    Where the tokenizer's folder is known before the model loads (`_known_tokenizer_path`), the detokenizer starts
    and this process loads the tokenizer while the scheduler loads the model, not after it (~4 s of a start)."""
    from radixflow.runtime.server.scheduler_process import run_scheduler_process

    ctx = mp.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    procs["scheduler"] = ctx.Process(
        target=run_scheduler_process, args=(args, ipc, writer, os.getpid()), name="radixflow-scheduler"
    )
    procs["scheduler"].start()
    writer.close()
    early = _known_tokenizer_path(args)
    with ThreadPoolExecutor(1) as pool:
        tokenizer = pool.submit(_load_tokenizer_or_none, early) if early else None
        if early:
            _start_detokenizer(ctx, args, early, ipc, procs)
        info = _wait_ready(reader, procs["scheduler"])
        if early and info.tokenizer_path == early:
            return info, tokenizer.result()
    if early:  # not expected (_known_tokenizer_path follows model_runner), but the scheduler's folder wins
        stop_processes({"detokenizer": procs.pop("detokenizer")}, CHILD_JOIN_S, terminate=True)
    _start_detokenizer(ctx, args, info.tokenizer_path, ipc, procs)
    return info, None


def _known_tokenizer_path(args: ServerArgs) -> Optional[str]:
    """The tokenizer folder the scheduler will report, where it is known without loading anything: given, or a model
    folder / converted GGUF (model_runner: a dummy model's .json config takes the default model's tokenizer)."""
    from radixflow.model_files import ready_model_dir

    if args.tokenizer_path:
        return args.tokenizer_path
    dummy_json = args.load_format == "dummy" and args.model_path and args.model_path.endswith(".json")
    return ready_model_dir(None if dummy_json else args.model_path)


def _load_tokenizer_or_none(path: str) -> Any:
    """The tokenizer, or None where it fails: TokenizerManager then loads it again and reports the error."""
    from radixflow.model_files import load_tokenizer

    try:
        return load_tokenizer(path)
    except Exception:
        return None


def _start_detokenizer(ctx, args: ServerArgs, tokenizer_path: str, ipc: IpcNames, procs: dict) -> None:
    from radixflow.runtime.server.detokenizer import run_detokenizer_process

    procs["detokenizer"] = ctx.Process(
        target=run_detokenizer_process, args=(tokenizer_path, ipc, os.getpid(), args.log_level),
        name="radixflow-detokenizer",
    )
    procs["detokenizer"].start()


def _wait_ready(reader, proc) -> ModelInfo:
    while not reader.poll(0.2):
        if not proc.is_alive():
            raise StartupError(f"the scheduler process exited while loading the model ({_exit_text(proc.exitcode)})")
    try:
        status, payload = reader.recv()
    except EOFError:
        raise StartupError(f"the scheduler process exited while loading the model ({_exit_text(proc.exitcode)})") from None
    if status != "ok":
        raise StartupError(payload)
    return payload


async def _serve(args: ServerArgs, info: ModelInfo, tokenizer: Any, ipc: IpcNames, procs: dict, stop: dict) -> int:
    import uvicorn

    from radixflow.runtime.server.http_server import create_app
    from radixflow.runtime.server.tokenizer_manager import TokenizerManager

    tm = TokenizerManager(args, info, ipc, tokenizer)
    tm.child_pids = {name: p.pid for name, p in procs.items()}
    tm.start()
    config = uvicorn.Config(
        create_app(tm),
        host=args.host,
        port=args.port,
        log_level=_uvicorn_level(args.log_level),
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    server = uvicorn.Server(config)
    state = {"exit": 0}
    tasks = [
        asyncio.create_task(_watch_children(server, tm, procs, state)),
        asyncio.create_task(_announce(server, args, tm.model_name)),
        asyncio.create_task(_fail_open_requests_at_shutdown(server, tm)),
    ]
    stop["serving"] = True
    try:
        await server.serve()
    except SystemExit as e:  # uvicorn exits like this when it cannot bind the port
        state["exit"] = e.code if isinstance(e.code, int) and e.code else 1
    finally:
        for t in tasks:
            t.cancel()
    if not server.started and state["exit"] == 0:
        state["exit"] = 1
    return state["exit"]


async def _announce(server, args: ServerArgs, model_name: str) -> None:
    while not server.started:
        await asyncio.sleep(0.05)
    print(f"radixflow server ready at http://{args.host}:{args.port} (model: {model_name}, pid {os.getpid()})", flush=True)


async def _watch_children(server, tm, procs: dict, state: dict) -> None:
    while True:
        await asyncio.sleep(WATCH_PERIOD_S)
        for name, proc in procs.items():
            if not proc.is_alive():
                reason = f"the {name} process died ({_exit_text(proc.exitcode)}); the server is shutting down"
                log.error(reason)
                print(f"radixflow: {reason}", file=sys.stderr, flush=True)
                tm.fail_all(reason)
                state["exit"] = 1
                server.should_exit = True
                return


async def _fail_open_requests_at_shutdown(server, tm) -> None:
    """Requests still open halfway through the graceful shutdown get a 503 (a JSON error, or a stream's error event):
    at its end uvicorn cancels them, and their clients got a plain-text 500 (fuzzing, session 29)."""
    while not server.should_exit:
        await asyncio.sleep(WATCH_PERIOD_S)
    await asyncio.sleep(GRACEFUL_SHUTDOWN_S / 2)
    tm.fail_all("the server is shutting down; send the request again (to another server)")


def _uvicorn_level(level: str) -> str:
    level = level.lower()
    return level if level in ("critical", "error", "warning", "info", "debug", "trace") else "info"
