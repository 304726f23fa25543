"""How a child process ended, in words (for logs and error messages)."""

from __future__ import annotations

import signal
from typing import Optional


def exit_text(code: Optional[int]) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
