"""Small regexes shared by the DSL, the OpenAI layer and the JSON-schema compiler:
escaped choice alternations, dtypes, and integer / number ranges.

Every regex here uses only syntax that Python's `re` and the Rust `regex` crate
(which outlines-core compiles) read alike.
"""

from __future__ import annotations

import math
from typing import Optional, Union

from radixflow.errors import RadixflowError

_META = set("\\.^$|?*+()[]{}")

INT_REGEX = r"-?(?:0|[1-9][0-9]*)"
FLOAT_REGEX = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
BOOL_REGEX = r"(?:True|False)"
STR_REGEX = r'"[^"\\\x00-\x1F]*"'  # a double-quoted string without escapes or control characters

_DTYPES = {int: INT_REGEX, float: FLOAT_REGEX, bool: BOOL_REGEX, str: STR_REGEX}
_DTYPE_NAMES = {"int": int, "float": float, "bool": bool, "str": str}


def escape(text: str) -> str:
    """A regex matching `text` literally (meta characters escaped, control characters as \\xHH)."""
    out = []
    for ch in text:
        if ch in _META:
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def regex_for_choices(choices: list) -> str:
    """One of `choices`, exactly: `(?:a|b|c)` with each choice escaped."""
    if not isinstance(choices, (list, tuple)) or not choices:
        raise RadixflowError("choices must be a non-empty list of strings")
    if not all(isinstance(c, str) and c for c in choices):
        raise RadixflowError("every choice must be a non-empty string")
    return "(?:" + "|".join(escape(c) for c in dict.fromkeys(choices)) + ")"


def regex_for_dtype(dtype: Union[type, str]) -> str:
    """int, float, bool (True/False) or str (a double-quoted string); names accepted too."""
    if isinstance(dtype, str):
        dtype = _DTYPE_NAMES.get(dtype, dtype)
    if dtype not in _DTYPES:
        raise RadixflowError(f"dtype must be one of int, float, bool, str; got {dtype!r}")
    return _DTYPES[dtype]


# -- integer ranges ------------------------------------------------------------------------------
def _same_length(lo: str, hi: str) -> list[str]:
    """Patterns covering the decimal strings in [lo, hi], both of one length."""
    if lo == hi:
        return [lo]
    n = len(lo)
    if n == 1:
        return [f"[{lo}-{hi}]"]
    if lo[0] == hi[0]:
        return [lo[0] + p for p in _same_length(lo[1:], hi[1:])]
    zeros, nines = "0" * (n - 1), "9" * (n - 1)
    parts, first, last = [], int(lo[0]), int(hi[0])
    if lo[1:] != zeros:
        parts += [lo[0] + p for p in _same_length(lo[1:], nines)]
        first += 1
    tail = []
    if hi[1:] != nines:
        tail = [hi[0] + p for p in _same_length(zeros, hi[1:])]
        last -= 1
    if first <= last:
        digit = str(first) if first == last else f"[{first}-{last}]"
        parts.append(f"{digit}[0-9]{{{n - 1}}}")
    return parts + tail


def natural_range(lo: int, hi: Optional[int]) -> str:
    """Decimal strings (no leading zeros) of the integers in [lo, hi]; hi None = unbounded."""
    assert lo >= 0 and (hi is None or hi >= lo)
    parts = []
    top = len(str(hi)) if hi is not None else len(str(lo))
    for n in range(len(str(lo)), top + 1):
        a = max(lo, 10 ** (n - 1) if n > 1 else 0)
        b = 10**n - 1 if hi is None else min(hi, 10**n - 1)
        parts += _same_length(str(a), str(b))
    if hi is None:
        parts.append(f"[1-9][0-9]{{{top},}}")
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


def int_range_regex(lo: Optional[int], hi: Optional[int]) -> str:
    """JSON integers in [lo, hi]; None = unbounded on that side."""
    if lo is not None and hi is not None and lo > hi:
        raise RadixflowError(f"empty integer range: minimum {lo} > maximum {hi}")
    parts = []
    if lo is None or lo < 0:  # negatives: magnitudes in [max(1, -hi), -lo]
        mag_lo = 1 if hi is None or hi >= 0 else -hi
        parts.append("-" + natural_range(mag_lo, None if lo is None else -lo))
    if hi is None or hi >= 0:
        parts.append(natural_range(max(lo or 0, 0), hi))
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


def integer_bounds(lo, hi, excl_lo, excl_hi) -> tuple[Optional[int], Optional[int]]:
    """Bounds (JSON-schema style, possibly fractional or exclusive) as inclusive integers."""
    ilo = None if lo is None else math.ceil(lo)
    ihi = None if hi is None else math.floor(hi)
    if excl_lo is not None:
        e = math.floor(excl_lo) + 1
        ilo = e if ilo is None else max(ilo, e)
    if excl_hi is not None:
        e = math.ceil(excl_hi) - 1
        ihi = e if ihi is None else min(ihi, e)
    return ilo, ihi


def number_range_regex(lo, hi, excl_lo=None, excl_hi=None) -> str:
    """JSON numbers within the bounds (no exponent). Sound, not complete: decimals are
    produced only where their whole unit interval lies inside the range."""
    ia, ib = integer_bounds(lo, hi, excl_lo, excl_hi)
    parts = []
    if ia is None or ib is None or ia <= ib:
        parts.append(int_range_regex(ia, ib))
    frac = r"\.[0-9]+"
    pos_lo = max(ia, 0) if ia is not None else 0
    if ib is None or ib - 1 >= pos_lo:  # I.f in [I, I+1) within [ia, ib]
        parts.append(natural_range(pos_lo, None if ib is None else ib - 1) + frac)
    if ia is None or ia < 0:  # -M.f in (-(M+1), -M] within [ia, ib]
        mag_lo = 0 if ib is None or ib >= 0 else -ib
        mag_hi = None if ia is None else -ia - 1
        if mag_hi is None or mag_hi >= mag_lo:
            parts.append("-" + natural_range(mag_lo, mag_hi) + frac)
    if excl_lo is not None and float(excl_lo).is_integer() and excl_lo >= 0:  # e.f, f > 0, within (e, e+1)
        e = int(excl_lo)
        if all(b is None or b >= e + 1 for b in (hi, excl_hi)):
            parts.append(f"{e}\\.[0-9]*[1-9][0-9]*")
    if not parts:
        raise RadixflowError(f"the number range [{lo}, {hi}] is too narrow to express; widen it to span an integer")
    return "(?:" + "|".join(parts) + ")"


_ECMA_CLASSES = {"d": "0-9", "w": "A-Za-z0-9_"}


def ecma_regex(regex: str) -> str:
    """ECMA-262 (JSON Schema's dialect) shorthands in the ASCII sense the standard gives
    them: `\\d` is [0-9] and `\\w` [A-Za-z0-9_] (the Rust regex engine reads them as
    Unicode classes, which would let e.g. U+0BE9 through as a digit)."""
    out, i, in_class = [], 0, False
    while i < len(regex):
        c = regex[i]
        if c == "\\" and i + 1 < len(regex):
            e = regex[i + 1]
            body = _ECMA_CLASSES.get(e.lower())
            if body is None:
                out.append(regex[i : i + 2])
            elif e.islower():
                out.append(body if in_class else f"[{body}]")
            elif in_class:  # \D / \W inside a class has no ASCII-only spelling here: keep it
                out.append(regex[i : i + 2])
            else:
                out.append(f"[^{body}]")
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class and out and out[-1] not in ("[", "[^"):
            in_class = False
        out.append(c)
        i += 1
    return "".join(out)
