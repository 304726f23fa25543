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
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch

from radixflow.constrained.options import BACKENDS, DEFAULT_BACKEND, DEFAULT_COMPILE_TIMEOUT_S, GrammarOptions, TokenizerInfo
from radixflow.constrained.spec_checks import check_spec
from radixflow.errors import GrammarError

def grammar_backend(name: str, info: TokenizerInfo):
    """The compiler of backend `name` for a tokenizer (built once per pair)."""
    if name not in BACKENDS:
        raise GrammarError(f"unknown grammar backend {name!r}; use one of {', '.join(BACKENDS)}")
    return _backend(name, info)


@functools.lru_cache(maxsize=16)
def _backend(name: str, info: TokenizerInfo):
    if name == "llguidance":
        from radixflow.constrained.llguidance_grammars import LLGuidanceGrammars
        from radixflow.constrained.llguidance_tokenizer import check_version

        check_version()
        return LLGuidanceGrammars(info)
    from radixflow.constrained.outlines_grammars import OutlinesGrammars

    return OutlinesGrammars(info)


def compile_grammar(backend, kind: str, spec: Any, options: GrammarOptions, timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S,
                    checked: bool = False, **limits):
    """Compile with `backend` (from grammar_backend); the compiled grammar has
    `compile_s`. `timeout_s` bounds the outlines backend's up-front DFA check; `limits` go to
    the backend's compile (outlines: max_dfa_states; `regex`: the one spec.to_regex made of this
    spec). `checked`: the caller already checked the spec (to_regex does). Raises GrammarError."""
    if not checked:
        check_spec(kind, spec)
    start = time.perf_counter()
    compiled = backend.compile(kind, spec, options, timeout_s, **limits)
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
    from radixflow.model_files import eos_token_ids, load_config, load_tokenizer, resolve_model

    path = resolve_model(None).path
    config = load_config(path)
    tok = load_tokenizer(path)
    return TokenizerInfo(tok, int(config.vocab_size), tuple(sorted(eos_token_ids(path, config, tok))))
