"""Child processes: a free local port for them, how one ended (in words), stopping a set."""

from __future__ import annotations

import signal
import socket
import time
from typing import Optional


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exit_text(code: Optional[int]) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def stop_processes(procs: dict, timeout_s: float, terminate: bool = False) -> None:
    """Wait up to `timeout_s` in all for `procs` (multiprocessing processes) to end, after a
    SIGTERM when `terminate`; kill whichever is still alive then."""
    if terminate:
        for proc in procs.values():
            if proc.is_alive():
                proc.terminate()
    deadline = time.time() + timeout_s
    for proc in procs.values():
        proc.join(max(deadline - time.time(), 0.1))
        if proc.is_alive():
            proc.kill()
            proc.join(1)
