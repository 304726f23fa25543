r"""`stop_regex` (SGLang's sampling field): a gen stops once one of these patterns matches the end of
its output, checked after every sampled token.

Each check decodes only the output's tail: a token decodes to at least one byte, so a match
that ends in the newest token starts within 4 times the patterns' longest match (`width`, in characters, each at
most 4 bytes of UTF-8) of tokens before it. A pattern with no longest match (`+`, `*`, `{n,}`) is searched for in the last
UNBOUNDED_WINDOW characters of the gen's output, whose text the request keeps and extends a few tokens at a
time, from the first place where a match could still start (stop_regex_search.py): a search costs at most that
window, even for patterns whose search time grows with the square (or a higher power) of the text, and for most
patterns only the newest characters. Patterns that nest unbounded repeats (`(a+)+`, `(\w+\s?)*`) are
refused: Python's regex search can take exponential time on them, and it runs in the scheduler's loop. The finish reason is SGLang's: {"type": "stop", "matched": <the pattern>}, so
the output is cut where the pattern's own text appears in it, as SGLang cuts it; a pattern with
regex syntax (almost every one) keeps the text it matched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from radixflow.errors import RadixflowError
from radixflow.runtime.stop_regex_search import WINDOW, growing_pattern

try:  # Python 3.11+; sre_parse and sre_constants before
    from re import _constants as _sre_c, _parser as _sre_parse
except ImportError:  # pragma: no cover
    import sre_constants as _sre_c  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

MAX_PATTERNS = 32  # SGLang's limits
MAX_PATTERN_BYTES = 256
# A longest match past TAIL_WIDTH characters is searched for in the gen's kept text (its last UNBOUNDED_WINDOW
# characters, decoded a few tokens at a time), as one with none is: a check decodes up to 4 tokens a character of
# the width (stop_checker.py's _tail), so x{1,60000} decoded the whole output on every token.
TAIL_WIDTH = 64
UNBOUNDED_WINDOW = WINDOW  # the characters of a gen's output searched for a pattern with no (or a long) longest match


@dataclass(frozen=True)
class StopPatterns:
    patterns: tuple  # compiled, in the request's order
    width: Optional[int]  # the longest text any of them matches, in characters; None: no bound
    growing: tuple = ()  # where width is None: each pattern for the incremental search (stop_regex_search.py)


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
    patterns, width, asserts = [], 0, []
    for t in texts:
        check_text("stop_regex", t)
        if len(t.encode()) > MAX_PATTERN_BYTES:
            raise RadixflowError(f"a stop_regex pattern is {len(t.encode())} bytes, over the {MAX_PATTERN_BYTES}-byte limit")
        try:
            p = re.compile(t)
        except (re.error, RecursionError, OverflowError) as e:
            raise RadixflowError(f"stop_regex {t!r} is not a valid regular expression: {e}") from None
        parsed = _sre_parse.parse(t)
        if _nested_repeats(parsed):
            raise RadixflowError(f"stop_regex {t!r} nests unbounded repeats (as in (a+)+), whose search can take "
                                 "exponential time; rewrite it without the nesting (e.g. (a+)+b as a+b)")
        shortest, longest = parsed.getwidth()
        if shortest == 0:  # it matches the empty text, or an empty place in any text (\b, (?=a))
            raise RadixflowError(f"stop_regex {t!r} matches the empty text, so it would stop at once; make it match at least one character")
        patterns.append(p)
        asserts.append(_has_assertion(parsed))
        width = max(width, longest)
    if width <= TAIL_WIDTH:
        return StopPatterns(tuple(patterns), width)
    return StopPatterns(tuple(patterns), None, tuple(None if a else growing_pattern(p) for p, a in zip(patterns, asserts)))


def check_text(name: str, text: str) -> None:
    """A stop string or pattern must be text: a lone surrogate ('\\udcff') has no UTF-8."""
    try:
        text.encode()
    except UnicodeEncodeError:
        raise RadixflowError(f"{name} {text!r} holds a lone surrogate (such as '\\udcff'), which is not text; remove it") from None


def _nested_repeats(items, inside: bool = False) -> bool:
    """Whether a parsed pattern has an unbounded backtracking repeat inside another (star height two or more).
    Possessive repeats and atomic groups do not backtrack into their bodies, so they neither count nor nest."""
    for op, av in items:
        if op in (_sre_c.MAX_REPEAT, _sre_c.MIN_REPEAT):
            unbounded = av[1] == _sre_c.MAXREPEAT
            if (unbounded and inside) or _nested_repeats(av[2], inside or unbounded):
                return True
        elif op is _sre_c.SUBPATTERN and _nested_repeats(av[3], inside):
            return True
        elif op is _sre_c.BRANCH and any(_nested_repeats(b, inside) for b in av[1]):
            return True
        elif op in (_sre_c.ASSERT, _sre_c.ASSERT_NOT) and _nested_repeats(av[1], inside):
            return True
    return False


# anchors, lookarounds, backreferences: their partial matches cannot be trusted, so a pattern holding one is searched
# over the window, not incrementally (stop_regex_search.py says why)
_ASSERTIONS = (_sre_c.AT, _sre_c.ASSERT, _sre_c.ASSERT_NOT, _sre_c.GROUPREF, _sre_c.GROUPREF_EXISTS)


def _has_assertion(items) -> bool:
    """Whether a parsed pattern holds one of _ASSERTIONS anywhere, nested groups, branches and repeats included."""
    for op, av in items:
        if op in _ASSERTIONS:
            return True
        for part in av if isinstance(av, (list, tuple)) else ():
            nested = part if isinstance(part, (list, tuple)) else (part,)
            if any(isinstance(x, _sre_parse.SubPattern) and _has_assertion(x) for x in nested):
                return True
    return False


def first_match(stops: StopPatterns, text: str, pos: int = 0) -> Optional[str]:
    """The first pattern (its text) that matches somewhere in `text` from `pos` on, or None."""
    for p in stops.patterns:
        if p.search(text, pos) is not None:
            return p.pattern
    return None
