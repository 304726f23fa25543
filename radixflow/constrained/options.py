"""What a grammar compile depends on besides its spec: the options (part of the cache
key) and the tokenizer it is compiled for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from radixflow.constrained.json_any import DEFAULT_DEPTH

BACKENDS = ("outlines", "llguidance")
# llguidance covers more JSON Schema with no invalid output accepted and compiles in milliseconds; both backends
# give budget-aware completion (outlines from exact per-state distances, llguidance from a searched closing path).
DEFAULT_BACKEND = "llguidance"
DEFAULT_COMPILE_TIMEOUT_S = 10.0  # --grammar-compile-timeout-s
# `auto`: requests of one json_schema / regex grammar before it is compiled on outlines too. A busy
# grammar (a batch job's schema) pays outlines' compile once; a schema per request never does.
# Here, not in backend.py, so that ServerArgs' help can name it without importing outlines-core
PROMOTE_AFTER = 8
MAX_GRAMMAR_THREADS = 256  # --grammar-threads above this is refused (a thread per CPU is the useful most)


@dataclass(frozen=True)
class GrammarOptions:
    """`whitespace`: regex of the whitespace allowed between JSON tokens (None or "" =
    compact JSON, e.g. '[ ]?' also accepts json.dumps' ", " and ": "); `any_depth`: how
    deep free-form JSON may nest (outlines backend only)."""

    whitespace: Optional[str] = None
    any_depth: int = DEFAULT_DEPTH


@dataclass(frozen=True, eq=False)
class TokenizerInfo:
    tokenizer: Any  # a Hugging Face (fast) tokenizer
    vocab_size: int  # the model's logits width (may exceed the tokenizer's)
    eos_ids: tuple
