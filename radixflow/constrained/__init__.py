"""Constrained decoding: regex / JSON-schema / EBNF grammars compiled by a grammar
backend (outlines-core or llguidance) into per-request matchers that fill packed
bitmasks, with jump-forward and (outlines) budget-aware completion.

Public API: `Grammar.from_json_schema / from_regex / from_ebnf` and `g.accepts(text)`
(grammar.py); errors are `radixflow.GrammarError`. Helpers for other layers (DSL,
OpenAI API): `regex_for_choices`, `regex_for_dtype`, `regex_for_schema`, and
`validate(kind, spec, backend)` for up-front checks. The runtime uses
`radixflow.constrained.backend.GrammarBackend`.
"""

from radixflow.constrained.grammar import Grammar, compile_grammar, grammar_backend
from radixflow.constrained.json_schema import COMPACT_WHITESPACE, regex_for_schema
from radixflow.constrained.options import BACKENDS, DEFAULT_BACKEND, GrammarOptions
from radixflow.constrained.regex_helpers import escape, regex_for_choices, regex_for_dtype
from radixflow.constrained.spec import to_regex, validate
from radixflow.errors import GrammarError

__all__ = [
    "BACKENDS",
    "COMPACT_WHITESPACE",
    "DEFAULT_BACKEND",
    "Grammar",
    "GrammarError",
    "GrammarOptions",
    "compile_grammar",
    "escape",
    "grammar_backend",
    "regex_for_choices",
    "regex_for_dtype",
    "regex_for_schema",
    "to_regex",
    "validate",
]
