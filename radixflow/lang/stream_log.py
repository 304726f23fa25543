"""Text deltas of a running program, for `text_iter()` from another thread."""

from __future__ import annotations

import threading
from typing import Any, Iterator, Optional


class StreamLog:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._chunks: list[tuple[Optional[str], str, Optional[dict]]] = []  # (variable or None, delta, meta_info)
        self.done = False
        self.error: Optional[BaseException] = None

    def put(self, var: Optional[str], delta: str, meta: Optional[dict] = None) -> None:
        """An empty delta is kept only if it carries logprobs (a gen's last tokens, cut as a stop
        string, add no text); text_iter() skips it, text_iter(with_meta) gives it."""
        if not delta and not (meta and meta.get("output_token_logprobs")):
            return
        with self._cond:
            self._chunks.append((var, delta, meta))
            self._cond.notify_all()

    def close(self, error: Optional[BaseException] = None) -> None:
        with self._cond:
            self.done = True
            self.error = error
            self._cond.notify_all()

    def wait(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.done)

    def iter(self, var: Optional[str] = None, with_meta: bool = False) -> Iterator[Any]:
        """Deltas of the whole text (var=None) or of one variable, until the program ends;
        with_meta: (delta, meta_info of the gen that made it) pairs."""
        pos = 0
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self.done or len(self._chunks) > pos)
                chunks, done, error = self._chunks[pos:], self.done, self.error
            pos += len(chunks)
            for v, delta, meta in chunks:
                if (var is None or v == var) and (delta or with_meta):
                    yield (delta, meta) if with_meta else delta
            if done and pos >= len(self._chunks):
                if error is not None:
                    raise error
                return


class ChunkMeta:
    """The meta_info of one streamed chunk of a gen, as SGLang's frontend gives it: the
    chunk's own output logprobs, and how many there are so far."""

    def __init__(self) -> None:
        self.sent = 0

    def __call__(self, meta: Optional[dict]) -> Optional[dict]:
        if not meta or "output_token_logprobs" not in meta:
            return meta
        lps = meta["output_token_logprobs"]
        out = {**meta, "output_token_logprobs": lps[self.sent :], "output_token_logprobs_length": len(lps)}
        self.sent = len(lps)
        return out


class QuietLog:
    """The log of a replayed request graph: its text is all there when the state is made, so
    nobody reads deltas from it and none are kept (a StreamLog's condition and lock per strand
    were most of a replay's thread-library time)."""

    done = True
    error: Optional[BaseException] = None

    def put(self, var: Optional[str], delta: str, meta: Optional[dict] = None) -> None:
        pass
