"""Text deltas of a request graph's main strand, as an eager program's text_iter() sees
them: constant text when the strand passes it, a gen's text as its tokens are sampled
(held back while it could still end mid-character or be cut by a stop string), a
select's choice, n > 1's first sample, and the branches' text at a concatenating join.
Fork branches stream nothing of their own, as in eager mode."""

from __future__ import annotations

from typing import Callable, Optional

from radixflow.runtime.incremental_text import IncrementalText, partial_stop_len
from radixflow.runtime.scheduling.req import Req

OnDelta = Callable[[Optional[str], str], None]  # (variable or None, text)


class StrandStream:
    def __init__(self, on_delta: OnDelta, tokenizer):
        self.on_delta = on_delta
        self.tokenizer = tokenizer
        self.decoded = IncrementalText()
        self.shown = 0  # characters of the running gen sent so far

    def text(self, var: Optional[str], text: str) -> None:
        if text:
            self.on_delta(var, text)

    def progress(self, req: Req, var: Optional[str]) -> None:
        """A running gen: send what is settled of its text since the last call."""
        sp = req.sampling
        text = self.decoded.update(self.tokenizer, req.output_ids[req.segment_start :], sp.skip_special_tokens)
        safe = len(text) - partial_stop_len(text, sp.stop_strs)
        if safe > self.shown:
            self.on_delta(var, text[self.shown : safe])
            self.shown = safe

    def finished(self, var: Optional[str], text: str) -> None:
        """A gen's final text (stop-trimmed): send the rest of it."""
        self.text(var, text[self.shown :])
        self.decoded, self.shown = IncrementalText(), 0
