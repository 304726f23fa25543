"""Text of a growing list of output token ids, decoded a window at a time: only the ids
since the last confirmed boundary are decoded again, and an incomplete UTF-8 character
at the end waits for the next token. Used by the detokenizer's streams, by streamed
request graphs and by the stop checker's unbounded stop_regex patterns. StreamText is a
stream's text as its reader sees it (the server's detokenizer and an Engine stream)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

CONTEXT_TOKENS = 6  # a window's context before its new ids: more than one character's tokens (4 bytes)


@dataclass
class IncrementalText:
    text: str = ""  # confirmed text of ids[start:read] (start: the first `surr`)
    surr: int = 0  # decode window start (context so spaces/merges come out right)
    read: int = 0  # ids up to here are in `text`
    pending: str = ""  # the text of ids[read:] as last decoded, while it ends in an incomplete character

    def update(self, tokenizer, ids: list, skip_special_tokens: bool = True) -> str:
        """The text of `ids` (which only grow between calls), as far as it is settled."""
        return self.update_with(lambda part: tokenizer.decode(part, skip_special_tokens=skip_special_tokens), ids)

    def update_with(self, decode: Callable[[list], str], ids: list) -> str:
        """update() through `decode(ids) -> str`."""
        if len(ids) > self.read:
            prefix = decode(ids[self.surr : self.read])
            full = decode(ids[self.surr :])
            self.pending = full[len(prefix) :]
            if not full.endswith("\ufffd"):
                self.text += self.pending
                # the next window starts a few tokens back (context for spaces and split characters), not at the
                # old read point: after many tokens at once (a jump, a gen's first check) that would decode them all again
                self.surr, self.read, self.pending = max(self.read, len(ids) - CONTEXT_TOKENS), len(ids), ""
        return self.text


@dataclass
class StreamText:
    """A streamed request's text so far as its reader is shown it: decoded a window at a time from output `start` (a
    request graph's gen: its segment), with a tail that could still become a stop string (cut_strs) held back; after
    its outputs were cut back (a stop, a grammar: `restart`) decoded again from `start`."""

    skip_special_tokens: bool = True
    cut_strs: list = field(default_factory=list)
    start: int = 0
    decoded: IncrementalText = field(init=False)

    def __post_init__(self):
        self._decode_from_start()

    def _decode_from_start(self) -> None:
        self.decoded = IncrementalText(surr=self.start, read=self.start)

    def shown(self, tokenizer, ids: list, restart: bool = False) -> str:
        if restart:
            self._decode_from_start()
        text = self.decoded.update(tokenizer, ids, self.skip_special_tokens)
        return text[: len(text) - partial_stop_len(text, self.cut_strs)]


def partial_stop_len(text: str, stops: list) -> int:
    """Length of the longest tail of `text` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best
