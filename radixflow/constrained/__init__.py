"""Constrained decoding: regex / JSON-schema / choice / dtype grammars compiled into
token FSMs (outlines-core), packed bitmasks, jump-forward and budget-aware completion.

Helpers for other layers (DSL, OpenAI API): `regex_for_choices`, `regex_for_dtype`,
`regex_for_schema`, and `validate(kind, spec)` for up-front checks. The runtime uses
`radixflow.constrained.backend.GrammarBackend`.
"""

from radixflow.constrained.json_schema import COMPACT_WHITESPACE, regex_for_schema
from radixflow.constrained.regex_helpers import escape, regex_for_choices, regex_for_dtype
from radixflow.constrained.spec import to_regex, validate

__all__ = [
    "COMPACT_WHITESPACE",
    "escape",
    "regex_for_choices",
    "regex_for_dtype",
    "regex_for_schema",
    "to_regex",
    "validate",
]
