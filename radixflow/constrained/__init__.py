"""Constrained decoding: regex / JSON-schema / EBNF grammars compiled by a grammar
backend (outlines-core or llguidance) into per-request matchers that fill packed
bitmasks, with jump-forward and (outlines) budget-aware completion.

Public API: `Grammar.from_json_schema / from_regex / from_ebnf` and `g.accepts(text)`
(grammar.py); errors are `radixflow.GrammarError`. Helpers for other layers (DSL,
OpenAI API): `regex_for_choices`, `regex_for_dtype`, `regex_for_schema`, and
`validate(kind, spec, backend)` for up-front checks. The runtime uses
`radixflow.constrained.backend.GrammarBackend`.

The names below are imported on first use, so that importing one submodule (the sampler
imports `batch_mask`) does not load the grammar packages (outlines-core, llguidance).
"""

import importlib
from typing import Any

from radixflow.errors import GrammarError

_WHERE = {
    "Grammar": "grammar",
    "compile_grammar": "grammar",
    "grammar_backend": "grammar",
    "COMPACT_WHITESPACE": "json_schema",
    "regex_for_schema": "json_schema",
    "BACKENDS": "options",
    "DEFAULT_BACKEND": "options",
    "GrammarOptions": "options",
    "escape": "regex_helpers",
    "regex_for_choices": "regex_helpers",
    "regex_for_dtype": "regex_helpers",
    "to_regex": "spec",
    "validate": "spec",
}

__all__ = sorted([*_WHERE, "GrammarError"])


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
