"""A grammar that starts after a reasoning model's thinking block (SGLang applies a grammar so under
`--reasoning-parser`).

`after_thinking` composes a request's grammar with a free block before it: any text without the end
marker, then the end marker, then what the grammar allows. Where the output starts inside the block
(the prompt opened it) the block is required; elsewhere it is optional and opens with the start
marker as the output's first characters, so a model that does not think meets the grammar at once.
Unlike a switch at the end marker's token, this works for markers of several tokens, and a grammar's
token budget closes the block in time to complete the answer.

A regex (and, on the outlines backend, a JSON schema's regex) is composed as one regex; on llguidance a
JSON schema or a Lark / GBNF grammar becomes the second grammar of a two-grammar llguidance request.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Optional

from radixflow.constrained.options import GrammarOptions
from radixflow.constrained.spec_checks import strip_anchors

# the end markers of runtime/reasoning.py's formats (constrained/ does not import runtime/; a test compares them)
END_MARKERS = ("</think>", "\u25c1/think\u25b7", "[/THINK]")
_META = set(".^$*+?()[]{}|\\")  # escaped outside a class; '<', '>' stay bare (\< is a word boundary in Rust's regex)
_CLASS_META = set("\\]^-[")


@functools.lru_cache(maxsize=64)
def free_text_then(marker: str) -> str:
    """Regex of any text that does not contain `marker`, followed by `marker` (its first occurrence ends the
    match). Built from the marker's matching automaton; needs a marker whose first character occurs once."""
    assert len(marker) > 1 and marker[0] not in marker[1:], f"unsupported marker {marker!r}"
    lit = [_literal(c) for c in marker]
    first = marker[0]
    # from "matched the first character": its prefixes that end with the first character again (back there) ...
    again = [lit[0]] + ["".join(lit[1:j]) + lit[0] for j in range(2, len(marker))]
    # ... and those that end with a character leaving the match (back to the start)
    leave = ["".join(lit[1:j]) + _none_of(marker[j], first) for j in range(1, len(marker))]
    at_first = f"{lit[0]}(?:{'|'.join(again)})*"
    return f"(?:{_none_of(first)}|{at_first}(?:{'|'.join(leave)}))*{at_first}{''.join(lit[1:])}"


def after_thinking(kind: str, spec: Any, start: str, end: str, inside: bool, backend: str,
                   options: GrammarOptions = GrammarOptions()) -> tuple[str, Any]:  # fmt: skip
    """(kind, spec) of the grammar `kind`/`spec` preceded by a thinking block between `start` and `end`;
    `inside`: the output starts in the block (the prompt opened it). The spec passed its up-front check."""
    block = free_text_then(end) if inside else f"(?:{_literal_text(start)}{free_text_then(end)})?"
    if kind == "regex":
        return "regex", f"{block}(?:{strip_anchors(spec)})"
    if backend == "outlines" and kind == "ebnf":
        return kind, spec  # outlines has no ebnf: refused later, as before
    if backend == "outlines":  # a JSON schema as its regex
        from radixflow.constrained.spec import to_regex  # outlines-core, only for this backend

        return "regex", f"{block}(?:{to_regex(kind, spec, options.whitespace, options.any_depth)})"
    answer = {**_answer(kind, spec, options), "name": "answer"}
    return "ebnf", json.dumps({"grammars": [_main(start, end, inside), answer]})


def _main(start: str, end: str, inside: bool) -> dict:
    free = _lark_regex(free_text_then(end))
    if inside:
        return {"name": "main", "lark_grammar": f"start: /{free}/ @answer"}
    opened = _lark_regex(_literal_text(start)) + free
    return {"name": "main", "lark_grammar": f"start: think? @answer\nthink: /{opened}/"}


def _answer(kind: str, spec: Any, options: GrammarOptions) -> dict:
    from radixflow.constrained.llguidance_text import grammar_text, lark_text

    if kind == "ebnf":
        return {"lark_grammar": lark_text(spec)}
    return json.loads(grammar_text(kind, spec, options))["grammars"][0]


def _literal(c: str) -> str:
    return "\\" + c if c in _META else c


def _literal_text(text: str) -> str:
    return "".join(map(_literal, text))


def _unescape(regex_text: str) -> str:
    """_literal_text's input back."""
    return re.sub(r"\\(.)", r"\1", regex_text)


def _none_of(*chars: str) -> str:
    return "[^" + "".join("\\" + c if c in _CLASS_META else c for c in dict.fromkeys(chars)) + "]"


@dataclass(frozen=True)
class Composed:
    """What `after_thinking` put together: the block's markers, its opening (the start marker where the block is
    optional, "" where the output starts inside it) and the request's own grammar after it."""

    end: str
    opening: str
    kind: str
    spec: Any


def composed_parts(kind: str, spec: Any) -> Optional[Composed]:
    """The parts of a grammar `after_thinking` made, None for any other (a request's own, or no reasoning parser).
    llguidance's closing search takes the end marker first (free text shows its walk no progress), and its sample
    strings come from the grammar after the block."""
    if kind == "regex" and isinstance(spec, str) and spec.endswith(")"):
        for end in END_MARKERS:
            free = free_text_then(end)
            if spec.startswith(free + "(?:"):
                return Composed(end, "", "regex", spec[len(free) + 3 : -1])
            at = spec.find(free + ")?(?:")
            if spec.startswith("(?:") and at > 3:
                return Composed(end, _unescape(spec[3:at]), "regex", spec[at + len(free) + 5 : -1])
    if kind == "ebnf" and isinstance(spec, str) and spec.startswith('{"grammars": [{"name": "main"'):
        main, answer = json.loads(spec)["grammars"]
        end = next(e for e in END_MARKERS if f"{_lark_regex(free_text_then(e))}/" in main["lark_grammar"])
        opened = main["lark_grammar"].partition("think: /")[2]
        opening = _unescape(opened[: opened.find(_lark_regex(free_text_then(end)))]) if opened else ""
        if answer.get("json_schema") is not None:
            return Composed(end, opening, "json_schema", answer["json_schema"])
        return Composed(end, opening, "ebnf", answer["lark_grammar"])
    return None


def _lark_regex(regex: str) -> str:
    return regex.replace("/", "\\/")  # a Lark regex is written between slashes
