"""A streamed request's reports as deltas. Each report carries what the request's lists (output ids, output and
input logprobs) gained since its last report, and where each gain starts; after outputs were cut back (a stop or a
grammar, rare) the output lists come whole again, from 0, and the receiver starts them over. Sent whole every time,
the lists made each report of a long stream cost more than the last (pickled by the scheduler and again by the
detokenizer: 1 ms a step for one request of 2,000 tokens with top logprobs; review, session 29). The receiver puts
the whole lists back together (Assembly).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Optional

from radixflow.runtime.scheduling.req import LogprobOptions, ReqOutput

_LISTS = ("output_ids", "new_output_token_logprobs", "new_output_top_logprobs", "new_output_token_ids_logprobs",
          "input_token_logprobs", "input_top_logprobs", "input_token_ids_logprobs")  # fmt: skip
_OUTPUT_LISTS = 4  # the first four are cut back with the outputs; input lists only grow
_PER_POSITION = ("top_logprobs", "token_ids_logprobs")  # lists whose entries are each a list of pairs (or None)


@dataclass
class Sent:
    """The sender's record of one streamed request: each list's length as its last report carried it, and the
    request's cuts then."""

    lengths: list = field(default_factory=lambda: [0] * len(_LISTS))
    cuts: int = 0


def as_delta(out: ReqOutput, sent: Sent) -> ReqOutput:
    """`out` (a request's whole lists, by reference) as what they gained since `sent`, which then records this
    report."""
    cut = out.cuts != sent.cuts
    starts = tuple(0 if cut and i < _OUTPUT_LISTS else n for i, n in enumerate(sent.lengths))
    tails = [(getattr(out, name) or [])[start:] for name, start in zip(_LISTS, starts)]
    sent.lengths, sent.cuts = [start + len(tail) for start, tail in zip(starts, tails)], out.cuts  # from the slices:
    return dataclasses.replace(out, **dict(zip(_LISTS, tails)), starts=starts)  # an Engine's lists may grow meanwhile


@dataclass
class Assembly:
    """The receiver's whole lists of one request, put back together from its reports. With `convert` (logprob pairs
    -> the result's [logprob, id, text] triples) each logprob entry is converted once, as it arrives, and the lists
    hold the triples (generate_request.build_result with logprob_text None): converted again at every report, a
    long stream's entries cost O(n) text lookups a token."""

    convert: Optional[Callable[[list], list]] = None
    lists: list = field(default_factory=lambda: [[] for _ in _LISTS])

    @classmethod
    def with_texts(cls, with_text: Callable[[list, bool], list], options: LogprobOptions) -> "Assembly":
        """An Assembly whose logprob entries become the triples `options` asks for (LogprobCollector.with_text); a
        request without logprobs has none to convert."""
        if not options.return_logprob:
            return cls()
        want = options.return_text_in_logprobs
        return cls(convert=lambda pairs: with_text(pairs, want))

    def apply(self, out: ReqOutput) -> ReqOutput:
        """`out` with its whole lists (with convert: always; without: itself where it carries them whole)."""
        if out.starts is None and self.convert is None:
            return out
        for i, (lst, name, start) in enumerate(zip(self.lists, _LISTS, out.starts or (0,) * len(_LISTS))):
            assert start <= len(lst), f"a report of {out.rid} starts past what arrived before"
            del lst[start:]
            lst.extend(self._converted(i, getattr(out, name) or []))
        return dataclasses.replace(out, **dict(zip(_LISTS, self.lists)), starts=None)

    def _converted(self, i: int, entries: list) -> list:
        if self.convert is None or _LISTS[i] == "output_ids":
            return entries
        if _LISTS[i].endswith(_PER_POSITION):
            return [None if t is None else self.convert(t) for t in entries]
        return self.convert(entries)
