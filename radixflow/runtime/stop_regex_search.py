r"""The search for unbounded stop_regex patterns (`\d+\.`, `[A-Z]{3,}`, `a.*z`) in a gen's growing text, checked
after every token, at a cost that follows the new text rather than the text so far.

Searched from its start at every check, a pattern cost up to its whole window (UNBOUNDED_WINDOW characters: 30-400 µs
a token on the CPU, per request). The `regex` package's partial matching says where a match could still start once
more text comes: a search that finds no full match returns the leftmost place where one could still complete (a
partial match), or nothing. Every earlier start is dead for good, since the text before the end does not change, so
the next check searches from there. For most patterns that place stays near the end; for one like `a.*z` it stays at
the first `a`, and the search is still capped at the window.

`regex` reads a few patterns other than `re` does (POSIX classes such as `[[:digit:]]`, which `re` reads as a set of
characters); those are searched with `re` over the window, as before. So are patterns with anchors, lookarounds or
backreferences: for them a partial search may name a later start than a match can still have (`\b` at the end of the
text is no partial match, so `\n\b\w+:` never stopped once a check ended on the `\n`: review, session 31)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Optional

import regex

from radixflow.runtime.incremental_text import IncrementalText

WINDOW = 4096  # the characters of a gen's output searched for a pattern with no (or a long) longest match
_READ_DIFFERENTLY = re.compile(r"\[[:=.]")  # a POSIX class, equivalence or collating element: `regex` reads it its way


def growing_pattern(pattern: re.Pattern) -> Optional[regex.Pattern]:
    """The pattern as `regex` compiles it, for the incremental search; None where `regex` would read it differently.
    (The caller leaves out patterns whose partial matches cannot be trusted: anchors, lookarounds, backreferences.)"""
    if _READ_DIFFERENTLY.search(pattern.pattern):
        return None
    try:
        return regex.compile(pattern.pattern, regex.VERSION0)
    except (regex.error, RecursionError, OverflowError):
        return None


@dataclass
class GrowingText:
    """One gen's decoded output (from `segment_start`), kept between checks, and where each pattern could still
    start a match (in characters from the gen's start). Outputs cut back drop it (the scheduler's rewind)."""

    segment_start: int
    text: IncrementalText
    dropped: int = 0  # characters trimmed off the front of text.text (only the window is searched)
    live: dict = field(default_factory=dict)  # pattern index -> the first place a match could still start

    @classmethod
    def at(cls, segment_start: int) -> "GrowingText":
        return cls(segment_start, IncrementalText(surr=segment_start, read=segment_start))

    def update(self, ids: list, decode: Callable[[list], str]) -> str:
        """The output's text so far (at least its last WINDOW characters), decoding only its newest tokens; it may
        end in U+FFFD, a character whose bytes are not all out yet."""
        settled = self.text.update_with(decode, ids)
        if len(settled) > 2 * WINDOW:  # keep no more than the window (nor copy it per token)
            self.dropped += len(settled) - WINDOW
            self.text.text = settled = settled[-WINDOW:]
        return settled + self.text.pending

    def first_match(self, patterns: tuple, growing: tuple, text: str) -> Optional[str]:
        """The first pattern (its text) that matches somewhere in the last WINDOW characters of `text` (update's,
        without a last U+FFFD), or None. `growing`: each pattern's growing_pattern."""
        settled = len(self.text.text)
        whole = text.rstrip("\ufffd")
        floor = max(0, len(whole) - WINDOW)
        for i, (plain, rx) in enumerate(zip(patterns, growing, strict=True)):
            if rx is None:
                if plain.search(whole, floor) is not None:
                    return plain.pattern
                continue
            m = rx.search(whole, max(floor, self.live.get(i, 0) - self.dropped), partial=True)
            if m is not None and not m.partial:
                return plain.pattern
            # no start before a partial match's can complete a match, nor any in the settled text without one
            self.live[i] = self.dropped + min(settled, len(whole) if m is None else m.start())
        return None
