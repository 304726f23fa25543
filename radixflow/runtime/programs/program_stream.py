"""Text deltas of a request graph's main strand, as an eager program's text_iter() sees
them: constant text when the strand passes it, a gen's text as its tokens are sampled
(held back while it could still end mid-character or be cut by a stop string), a
select's choice, n > 1's first sample, and the branches' text at a concatenating join.
Fork branches stream nothing of their own, as in eager mode. A gen's chunks carry its meta_info (token counts so far;
the last, the gen's whole meta_info), with that chunk's output logprobs if it asks for them (gen_logprobs.py); a
select's choice carries the select's."""

from __future__ import annotations

from typing import Callable, Optional

from radixflow.runtime.incremental_text import StreamText
from radixflow.runtime.programs.gen_logprobs import GenLogprobs
from radixflow.runtime.programs.program_meta import segment_tokens
from radixflow.runtime.scheduling.req import Req

OnDelta = Callable[[Optional[str], str, Optional[dict]], None]  # (variable or None, text, chunk meta_info or None)


class StrandStream:
    def __init__(self, on_delta: OnDelta, tokenizer):
        self.on_delta = on_delta
        self.tokenizer = tokenizer
        self.decoded: Optional[StreamText] = None  # the running gen's text
        self.shown = 0  # characters of the running gen sent so far
        self.decoding: Optional[tuple] = None  # (segment_start, cuts) that `decoded` follows

    def text(self, var: Optional[str], text: str, meta: Optional[dict] = None) -> None:
        if text:
            self.on_delta(var, text, meta)

    def progress(self, req: Req, var: Optional[str], lp: Optional[GenLogprobs] = None) -> None:
        """A running gen: send what is settled of its text since the last call (with the
        logprobs sampled since the last chunk, if `lp`)."""
        sp = req.sampling
        if self.decoding != (req.segment_start, req.cuts):  # a new gen, or outputs cut back: decoded afresh (text
            self.decoding = (req.segment_start, req.cuts)  # already sent stays sent; the rest follows once past it)
            self.decoded = StreamText(sp.skip_special_tokens, sp.cut_strs, req.segment_start)
        text = self.decoded.shown(self.tokenizer, req.output_ids)
        if len(text) > self.shown:
            self.on_delta(var, text[self.shown :], running_meta(req) if lp is None else {**running_meta(req), **lp.chunk(req)})
            self.shown = len(text)

    def finished(self, var: Optional[str], text: str, chunk: Optional[Callable[[], dict]] = None) -> None:
        """A gen's final text (stop-trimmed): send the rest of it (`chunk()`: its meta_info), or
        an empty delta if only logprobs remain (the last token was cut as a stop string)."""
        rest, meta = text[self.shown :], None if chunk is None else chunk()
        if rest or (meta and meta.get("output_token_logprobs")):
            self.on_delta(var, rest, meta)
        self.decoded, self.shown, self.decoding = None, 0, None


def running_meta(req: Req) -> dict:
    """A running gen's stream chunk meta_info without logprobs: its request and token counts so far."""
    return {"id": req.rid, **segment_tokens(req)}


def delta_event(var: Optional[str], text: str, meta: Optional[dict]) -> dict:
    """A streamed program's text delta as the Engine yields it and /program sends it."""
    return {"var": var, "text": text} if meta is None else {"var": var, "text": text, "meta_info": meta}
