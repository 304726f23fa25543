"""Text deltas of a running program, for `text_iter()` from another thread."""

from __future__ import annotations

import threading
from typing import Iterator, Optional


class StreamLog:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._chunks: list[tuple[Optional[str], str]] = []  # (variable being generated or None, delta)
        self.done = False
        self.error: Optional[BaseException] = None

    def put(self, var: Optional[str], delta: str) -> None:
        if not delta:
            return
        with self._cond:
            self._chunks.append((var, delta))
            self._cond.notify_all()

    def close(self, error: Optional[BaseException] = None) -> None:
        with self._cond:
            self.done = True
            self.error = error
            self._cond.notify_all()

    def wait(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.done)

    def iter(self, var: Optional[str] = None) -> Iterator[str]:
        """Deltas of the whole text (var=None) or of one variable, until the program ends."""
        pos = 0
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self.done or len(self._chunks) > pos)
                chunks, done, error = self._chunks[pos:], self.done, self.error
            pos += len(chunks)
            for v, delta in chunks:
                if var is None or v == var:
                    yield delta
            if done and pos >= len(self._chunks):
                if error is not None:
                    raise error
                return
