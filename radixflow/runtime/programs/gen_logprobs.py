"""Output logprobs of one gen in a request graph, in the shape /generate gives them.

A gen's request may have run earlier gens (a continued request), so the gen's logprobs are
the request's output logprobs from where the gen began. Text pieces appended between gens
are input, not samples: they add no logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from radixflow.runtime.scheduling.req import LogprobOptions, Req

WithText = Callable[[list, bool], list]  # LogprobCollector.with_text: [(lp, id)] -> [[lp, id, text]]


@dataclass
class GenLogprobs:
    options: LogprobOptions
    start: int  # len(req.output_token_logprobs) when the gen began
    top_start: int  # len(req.output_top_logprobs) then: it grows only while a gen asks for top logprobs
    with_text: WithText
    sent: int = 0  # logprobs already sent in stream chunks

    @classmethod
    def begin(cls, req: Req, options: Optional[LogprobOptions], with_text: WithText) -> Optional["GenLogprobs"]:
        """A gen starts on `req` now (a new request, or the next segment of one): its samples'
        logprobs from here on are the gen's. None (and no logprobs computed) if it asks none."""
        req.logprob = options or LogprobOptions()
        if options is None:
            return None
        return cls(options, len(req.output_token_logprobs), len(req.output_top_logprobs), with_text)

    def meta(self, req: Req, since: int = 0) -> dict:
        """The gen's logprobs from its `since`-th sample on, and how many it has in all."""
        want = self.options.return_text_in_logprobs
        lps = req.output_token_logprobs  # sliced once: a streamed gen calls this every chunk
        meta = {
            "input_token_logprobs": [],  # a gen's prompt is scored by no one: as /generate gives them by default
            "output_token_logprobs": self.with_text(lps[self.start + since :], want),
            "output_token_logprobs_length": len(lps) - self.start,
        }
        if self.options.top_logprobs_num:
            tops = req.output_top_logprobs[self.top_start + since :]
            meta["input_top_logprobs"] = []
            meta["output_top_logprobs"] = [None if t is None else self.with_text(t, want) for t in tops]
        return meta

    def chunk(self, req: Req, completion_tokens: Optional[int] = None) -> dict:
        """A stream chunk's meta_info: the logprobs since the last chunk, and the gen's tokens so
        far (default: the request's since the gen began). SGLang's frontend checks
        completion_tokens == output_token_logprobs_length in each."""
        meta = self.meta(req, self.sent)
        self.sent = meta["output_token_logprobs_length"]
        done = len(req.output_ids) - req.segment_start if completion_tokens is None else completion_tokens
        return {**meta, "completion_tokens": done}
