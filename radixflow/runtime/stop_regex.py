"""`stop_regex` (SGLang's sampling field): a gen stops once one of these patterns matches the end of
its output, checked after every sampled token.

Each check decodes only the output's tail: a token decodes to at least one character, so a match
that ends in the newest token starts within the patterns' longest match (`width`, in characters) of
tokens before it. A pattern with no longest match (`+`, `*`, `{n,}`) is searched for in the gen's whole
output, whose text the request keeps and extends a few tokens at a time (stop_checker.py). The finish reason is SGLang's: {"type": "stop", "matched": <the pattern>}, so
the output is cut where the pattern's own text appears in it, as SGLang cuts it; a pattern with
regex syntax (almost every one) keeps the text it matched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from radixflow.errors import RadixflowError

try:  # Python 3.11+; sre_parse before
    from re import _parser as _sre_parse
except ImportError:  # pragma: no cover
    import sre_parse as _sre_parse  # type: ignore[no-redef]

MAX_PATTERNS = 32  # SGLang's limits
MAX_PATTERN_BYTES = 256
UNBOUNDED = 1 << 16  # a longest match past this many characters: search the whole output instead


@dataclass(frozen=True)
class StopPatterns:
    patterns: tuple  # compiled, in the request's order
    width: Optional[int]  # the longest text any of them matches, in characters; None: no bound


def parse_stop_regex(value: Any) -> Optional[StopPatterns]:
    """The request's stop_regex (a pattern or a list of them) checked and compiled; None if unset or empty.
    RadixflowError says what to change."""
    if value is None or value == [] or value == "":
        return None
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise RadixflowError("stop_regex must be a string or a list of strings")
    if len(texts) > MAX_PATTERNS:
        raise RadixflowError(f"at most {MAX_PATTERNS} stop_regex patterns are allowed, got {len(texts)}")
    patterns, width = [], 0
    for t in texts:
        if len(t.encode()) > MAX_PATTERN_BYTES:
            raise RadixflowError(f"a stop_regex pattern is {len(t.encode())} bytes, over the {MAX_PATTERN_BYTES}-byte limit")
        try:
            p = re.compile(t)
        except (re.error, RecursionError, OverflowError) as e:
            raise RadixflowError(f"stop_regex {t!r} is not a valid regular expression: {e}") from None
        if p.search("") is not None:
            raise RadixflowError(f"stop_regex {t!r} matches the empty text, so it would stop at once; make it match at least one character")
        patterns.append(p)
        width = max(width, _sre_parse.parse(t).getwidth()[1])
    return StopPatterns(tuple(patterns), None if width >= UNBOUNDED else width)


def first_match(stops: StopPatterns, text: str) -> Optional[str]:
    """The first pattern (its text) that matches somewhere in `text`, or None."""
    for p in stops.patterns:
        if p.search(text) is not None:
            return p.pattern
    return None
