"""The child-process pattern the grammar backends share for work that must be killable (outlines-core
calls cannot be interrupted): a fresh `python -c CODE` (no main module is re-imported), a ready
handshake whose wait does not count against the work's limit, reads bounded by a deadline and done
without the GIL, and a kill.

    child = spawn(CODE)                   # CODE writes READY once its imports are done
    if not wait_ready(child, START_S): ...
    data = read_exact(child.stdout.fileno(), time.monotonic() + limit_s, size)
    stop(child)

Users: regex_guard.py (long-lived byte-DFA checkers), isolated_compile.py (one outlines compile each).
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

READY = b"ready\n"  # what a child writes (and flushes) once it can take work


def spawn(code: str, text: bool = False) -> subprocess.Popen:
    """`python -c code` with pipes for stdin / stdout (stderr dropped); `text`: text-mode pipes."""
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=text)  # fmt: skip


def wait_ready(child: subprocess.Popen, timeout_s: float) -> bool:
    """True once the child has written READY within `timeout_s` seconds (read from its pipe's descriptor,
    so nothing after it is left in the stream's buffer)."""
    try:
        return read_exact(child.stdout.fileno(), time.monotonic() + timeout_s, len(READY)) == READY
    except TimeoutError:
        return False


def read_exact(fd: int, deadline: float, size: int) -> bytearray:
    """`size` bytes from `fd` (fewer at its end), read in place without the GIL (no join of chunks:
    a copy of a large result would hold the GIL); TimeoutError past `deadline`."""
    out = bytearray(size)
    view, got = memoryview(out), 0
    while got < size:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise TimeoutError
        n = os.readv(fd, [view[got : got + (1 << 22)]])
        if not n:
            break
        got += n
    del view
    return out[:got] if got < size else out


def stop(child: subprocess.Popen) -> None:
    child.kill()
    child.wait()
