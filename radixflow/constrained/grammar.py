"""The public grammar API, and the one compile path the engine and the server share.

    from radixflow.constrained import Grammar
    g = Grammar.from_json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    g.accepts('{"a":1}')        # True: every token allowed by the mask, and the grammar may end there
    Grammar.from_regex(r"[0-9]{3}", backend="llguidance")
    Grammar.from_ebnf('start: "yes" | "no"', backend="llguidance")

`tokenizer=None` means the default model's tokenizer. A grammar that cannot be compiled
or enforced exactly raises `radixflow.GrammarError` (naming the keyword and its JSON
pointer where one keyword is at fault).
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch

from radixflow.constrained.options import BACKENDS, DEFAULT_BACKEND, DEFAULT_COMPILE_TIMEOUT_S, GrammarOptions, TokenizerInfo
from radixflow.errors import GrammarError

KINDS = ("regex", "json_schema", "ebnf")
MAX_SCHEMA_DEPTH = 128


def grammar_backend(name: str, info: TokenizerInfo):
    """The compiler of backend `name` for a tokenizer (built once per pair)."""
    if name not in BACKENDS:
        raise GrammarError(f"unknown grammar backend {name!r}; use one of {', '.join(BACKENDS)}")
    return _backend(name, info)


@functools.lru_cache(maxsize=16)
def _backend(name: str, info: TokenizerInfo):
    if name == "llguidance":
        from radixflow.constrained.llguidance_grammars import LLGuidanceGrammars

        return LLGuidanceGrammars(info)
    from radixflow.constrained.outlines_grammars import OutlinesGrammars

    return OutlinesGrammars(info)


def check_spec(kind: str, spec: Any) -> None:
    """The checks every backend shares: the kind, the spec's type, a JSON schema's nesting."""
    if kind not in KINDS:
        raise GrammarError(f"unknown grammar kind {kind!r}; use one of {', '.join(KINDS)}")
    if kind == "json_schema":
        if not isinstance(spec, (str, dict)):
            raise GrammarError("json_schema must be a JSON schema object or its JSON text")
        check_nesting(spec)
    elif not isinstance(spec, str) or not spec:
        raise GrammarError(f"{kind} must be a non-empty string")


def check_nesting(schema: Any) -> None:
    """Refuse schemas nested deeper than MAX_SCHEMA_DEPTH (iteratively: no recursion limit)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except RecursionError:
            schema = None
        except ValueError as e:
            raise GrammarError(f"json_schema is not valid JSON: {e}") from None
    stack, depth = [(schema, 1)], 0
    while stack and depth <= MAX_SCHEMA_DEPTH:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    if schema is None or depth > MAX_SCHEMA_DEPTH:
        raise GrammarError(
            f"json_schema is nested too deeply (over {MAX_SCHEMA_DEPTH} levels of objects/arrays); flatten it or use $ref"
        )


def compile_grammar(backend, kind: str, spec: Any, options: GrammarOptions, timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S):
    """Compile with `backend` (from grammar_backend); the compiled grammar has
    `compile_s`. `timeout_s` bounds the outlines backend's up-front DFA check. Raises GrammarError."""
    check_spec(kind, spec)
    start = time.perf_counter()
    compiled = backend.compile(kind, spec, options, timeout_s)
    compiled.compile_s = time.perf_counter() - start
    return compiled


@dataclass(eq=False)
class Grammar:
    kind: str
    spec: Any
    options: GrammarOptions
    backend: Any
    compiled: Any

    @classmethod
    def compile(cls, kind: str, spec: Any, tokenizer=None, backend: str = DEFAULT_BACKEND, **options) -> "Grammar":
        opts = _options(options)
        impl = grammar_backend(backend, tokenizer_info(tokenizer))
        return cls(kind, spec, opts, impl, compile_grammar(impl, kind, spec, opts))

    @classmethod
    def from_json_schema(cls, schema: Any, tokenizer=None, backend: str = DEFAULT_BACKEND, **options) -> "Grammar":
        """`schema`: a dict or its JSON text; options: `whitespace`, `any_depth` (GrammarOptions)."""
        return cls.compile("json_schema", schema, tokenizer, backend, **options)

    @classmethod
    def from_regex(cls, regex: str, tokenizer=None, backend: str = DEFAULT_BACKEND, **options) -> "Grammar":
        return cls.compile("regex", regex, tokenizer, backend, **options)

    @classmethod
    def from_ebnf(cls, ebnf: str, tokenizer=None, backend: str = "llguidance", **options) -> "Grammar":
        """Lark syntax (llguidance's), or GBNF (`rule ::= ...`); llguidance backend only."""
        return cls.compile("ebnf", ebnf, tokenizer, backend, **options)

    @property
    def compile_s(self) -> float:
        return self.compiled.compile_s

    @property
    def min_tokens(self) -> Optional[int]:
        """The fewest tokens of an output (outlines: exact; llguidance: found by search, an
        upper bound; None: none found). A max_new_tokens below it is refused."""
        return self.compiled.min_tokens

    def matcher(self, req=None):
        """Fresh per-request state: fill_bitmask / accept_token / is_terminated."""
        return self.backend.matcher(self.compiled, req)

    def accepts(self, text: str) -> bool:
        """Tokenize `text` (no special tokens) and walk the mask: True iff every token is
        allowed and the grammar may end there."""
        return self.accepts_ids(self.backend.info.tokenizer.encode(text, add_special_tokens=False))

    def accepts_ids(self, ids: list) -> bool:
        m = self.matcher()
        mask = torch.zeros(1, (self.backend.info.vocab_size + 31) // 32, dtype=torch.int32)
        for t in ids:
            m.fill_bitmask(mask, 0)
            if not (int(mask[0, t // 32]) >> (t % 32)) & 1:
                return False
            m.accept_token(t)
        return m.is_accepting


def _options(options: dict) -> GrammarOptions:
    known = GrammarOptions.__dataclass_fields__
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise GrammarError(f"unknown grammar option(s) {', '.join(unknown)}; use {', '.join(known)}")
    return GrammarOptions(**options)


def tokenizer_info(tokenizer=None) -> TokenizerInfo:
    """A TokenizerInfo for a HF tokenizer (vocab size and EOS from it), or the default model's."""
    if isinstance(tokenizer, TokenizerInfo):
        return tokenizer
    if tokenizer is None:
        return _default_tokenizer_info()
    return _info_for(tokenizer)


@functools.lru_cache(maxsize=8)
def _info_for(tokenizer) -> TokenizerInfo:
    return TokenizerInfo(tokenizer, len(tokenizer), (tokenizer.eos_token_id,))


@functools.lru_cache(maxsize=1)
def _default_tokenizer_info() -> TokenizerInfo:
    from radixflow.runtime.execution.model_loader import load_config, resolve_model
    from radixflow.runtime.tokenizer import eos_token_ids, load_tokenizer

    path = resolve_model(None).path
    config = load_config(path)
    tok = load_tokenizer(path)
    return TokenizerInfo(tok, int(config.vocab_size), tuple(sorted(eos_token_ids(path, config, tok))))
