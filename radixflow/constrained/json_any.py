"""Regexes for free-form JSON: any value, any object, any array, nested at most `depth`
containers deep.

outlines-core expands a free-form node (`{"type": "object"}`, `{}`, an array without
`items`) into its generic JSON regex, whose token index takes tens of seconds to build
(~44 s for `{"type": "object"}` on a busy 2-core CPU): every level of nesting multiplies
the DFA's states, and each state is matched against the whole vocabulary. These regexes
bound the nesting instead; with the default depth of 2 (an object whose values may be
objects or arrays of scalars) a free-form object compiles in about a second.

Every match is valid JSON (`json.loads`): strings exclude control characters and allow
only JSON's escapes, numbers follow JSON's grammar. `ws` is the whitespace pattern
allowed between tokens, laid out as outlines-core lays out its own regexes ("" = compact).
"""

from __future__ import annotations

import functools
from typing import Optional

DEFAULT_DEPTH = 2  # containers a free-form value may nest, itself included
MAX_DEPTH = 3  # a free-form object of depth 3 already takes ~12 s to compile on an idle CPU

STRING = r'"(?:[^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])*"'
NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
SCALAR = rf"{STRING}|{NUMBER}|true|false|null"


def check_depth(depth: int) -> int:
    if not isinstance(depth, int) or isinstance(depth, bool) or not 0 <= depth <= MAX_DEPTH:
        raise ValueError(f"free-form JSON depth must be an integer from 0 to {MAX_DEPTH}, got {depth!r}")
    return depth


@functools.lru_cache(maxsize=64)
def any_value_regex(depth: int = DEFAULT_DEPTH, ws: str = "") -> str:
    """Any JSON value with at most `depth` levels of objects/arrays (0: scalars only)."""
    if check_depth(depth) == 0:
        return SCALAR
    return f"{SCALAR}|{any_object_regex(depth, ws)}|{any_array_regex(depth, ws)}"


@functools.lru_cache(maxsize=64)
def any_object_regex(depth: int = DEFAULT_DEPTH, ws: str = "") -> str:
    """Any JSON object whose values nest at most `depth - 1` further containers
    (depth 0 is treated as 1: the object itself)."""
    value = any_value_regex(max(check_depth(depth) - 1, 0), ws)
    member = rf"{STRING}{ws}:{ws}(?:{value})"
    return rf"\{{{ws}(?:{member}(?:{ws},{ws}{member})*)?{ws}\}}"


@functools.lru_cache(maxsize=64)
def any_array_regex(depth: int = DEFAULT_DEPTH, ws: str = "", least: int = 0, most: Optional[int] = None) -> str:
    """Any JSON array of `least` to `most` items (None: no bound) that nest at most `depth - 1` further containers.
    A bounded count repeats the item's automaton `most` times: built by outlines-core from an item of any depth (a
    schema's items left free), maxItems 3 took longer than the compile limit."""
    value = any_value_regex(max(check_depth(depth) - 1, 0), ws)
    upper = "" if most is None else most - 1
    items = rf"(?:{value})(?:{ws},{ws}(?:{value})){{{max(least - 1, 0)},{upper}}}"
    return rf"\[{ws}{items if least else f'(?:{items})?'}{ws}\]"
