"""llguidance's grammar text for a request's spec (JSON schema, regex, Lark / GBNF), and the up-front
check of a spec that runs on the request path, before any tokenizer is involved."""

from __future__ import annotations

from typing import Any

from llguidance import LLMatcher
from llguidance.gbnf_to_lark import any_to_lark

from radixflow.constrained.grammar_errors import grammar_error, summary
from radixflow.constrained.options import GrammarOptions
from radixflow.constrained.spec_checks import check_spec, strip_anchors
from radixflow.errors import GrammarError

MAX_UPFRONT_CHARS = 20_000  # validate_grammar runs on the request path: keep it to milliseconds


def grammar_text(kind: str, spec: Any, options: GrammarOptions) -> str:
    """The llguidance grammar text of a request's json_schema / regex / ebnf spec (GrammarError if it has none)."""
    if kind == "json_schema":
        try:
            return LLMatcher.grammar_from_json_schema(spec, defaults=_json_options(options))
        except ValueError as e:
            raise GrammarError(f"json_schema is not a valid JSON object: {e}") from None
    if kind == "regex":
        return LLMatcher.grammar_from_regex(strip_anchors(spec))
    if kind == "ebnf":
        return LLMatcher.grammar_from_lark(lark_text(spec))
    raise GrammarError(f"unknown grammar kind {kind!r}")


def lark_text(text: str) -> str:
    """An ebnf spec as Lark text (GBNF is converted)."""
    try:
        gbnf = "::=" in text and not text.startswith("{")  # `{`: llguidance's own JSON (after_thinking.py)
        return any_to_lark(text) if gbnf else text  # GBNF (`root ::= ...`) is converted
    except Exception as e:  # the converter's own parse errors
        raise GrammarError(f"invalid ebnf grammar: {e}") from None


def _json_options(options: GrammarOptions) -> dict:
    if not options.whitespace:
        return {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
    return {"whitespace_flexible": True, "whitespace_pattern": options.whitespace}


def grammar_text_error(kind: str, spec: Any, detail: str) -> GrammarError:
    """llguidance's complaint about a spec, as the GrammarError a user reads."""
    if kind == "json_schema":
        return grammar_error(detail, spec)
    first = summary(detail)
    what = {"regex": "regex", "ebnf": "ebnf grammar (llguidance Lark syntax, or GBNF)"}[kind]
    return GrammarError(f"invalid or unsupported {what}: {first}")


def validate_grammar(kind: str, spec: Any, options: GrammarOptions = GrammarOptions()) -> None:
    """The up-front check (no tokenizer; milliseconds). Raises GrammarError."""
    check_spec(kind, spec)
    text = grammar_text(kind, spec, options)
    if len(text) > MAX_UPFRONT_CHARS:  # large grammars are checked by their compile, on the worker pool
        return
    error = LLMatcher.validate_grammar(text)
    if error:
        raise grammar_text_error(kind, spec, error)
