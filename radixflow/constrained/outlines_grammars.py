"""The outlines-core grammar backend: every grammar becomes one regex (JSON schemas
through `json_schema.regex_for_schema`), compiled into a token FSM with per-state
distances, so it supports jump-forward and budget-aware completion (fsm.py)."""

from __future__ import annotations

import functools
from typing import Any, Optional, Union

from radixflow.constrained.fsm import CompiledGrammar, compile_regex
from radixflow.constrained.isolated_compile import Limits, compile_isolated
from radixflow.constrained.jump_forward import plan_jump
from radixflow.constrained.matcher import GrammarMatcher
from radixflow.constrained.options import DEFAULT_COMPILE_TIMEOUT_S, GrammarOptions, TokenizerInfo
from radixflow.constrained.regex_guard import regex_dfa_size
from radixflow.constrained.spec import regex_error, to_regex
from radixflow.constrained.vocabulary import TokenVocab, build_token_vocab, plain_rust_tokenizer
from radixflow.errors import GrammarError


class OutlinesGrammars:
    name = "outlines"

    def __init__(self, info: TokenizerInfo):
        self.info = info
        self.vocab: TokenVocab = _token_vocab(info)
        # a jump's few characters go straight to the fast tokenizer's Rust side, skipping the wrapper's per-call setup
        self._backend = plain_rust_tokenizer(info.tokenizer)

    def compile(self, kind: str, spec: Any, options: GrammarOptions, timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S,
                max_dfa_states: Optional[int] = None, isolate: Optional[Limits] = None,
                regex: Optional[str] = None) -> CompiledGrammar:
        """The regex's byte-level DFA is built first in a child process killed past `timeout_s`
        (regex_guard.py): an exponential DFA fails this compile instead of holding its thread.
        `max_dfa_states`: refuse (GrammarError) a regex whose byte-level DFA has more states,
        before the token index (whose time, memory and GIL-held transitions grow with it) is built.
        `isolate`: build the token index in a child process within these limits (isolated_compile.py),
        so this process's GIL is not held for it. `regex`: the one to_regex already made of this spec."""
        if regex is None:
            regex = to_regex(kind, spec, options.whitespace or "", options.any_depth)
        error, states = regex_dfa_size(regex, timeout_s)
        if error:
            raise GrammarError(regex_error(regex, error))
        if max_dfa_states is not None and states > max_dfa_states:
            raise GrammarError(f"its byte-level automaton has {states} states, over the {max_dfa_states} allowed here")
        try:
            return compile_regex(regex, self.vocab) if isolate is None else compile_isolated(regex, self.vocab, isolate)
        except ValueError as e:
            raise GrammarError(regex_error(regex, str(e))) from None

    def matcher(self, grammar: CompiledGrammar, req=None, pool=None) -> GrammarMatcher:
        """`pool` is unused: copies of an outlines grammar share no lock."""
        return GrammarMatcher(grammar, req)

    def jump(self, matcher: GrammarMatcher, req, first: bool = False, forced: bool = True,
             limit: Optional[int] = None, cut: bool = True) -> Union[list, tuple]:
        """The forced continuation (`forced`: jump-forward is on; the budget needs no repairs
        here), at most `limit` tokens; `cut` False: the sampled token is never re-tokenized."""
        return plan_jump(matcher, req, self._encode, first=first, limit=limit, cut=cut) if forced else []

    def _encode(self, text: str) -> list:
        return list(self._encode_cached(text))

    @functools.lru_cache(maxsize=8192)  # noqa: B019 - one per tokenizer, kept for its life
    def _encode_cached(self, text: str) -> tuple:
        """A jump's text (last token + forced bytes) recurs across requests of a grammar."""
        if self._backend is not None:
            return tuple(self._backend.encode(text, add_special_tokens=False).ids)
        return tuple(self.info.tokenizer.encode(text, add_special_tokens=False))


_VOCABS: dict = {}


def _token_vocab(info: TokenizerInfo) -> TokenVocab:
    key = (id(info.tokenizer), info.vocab_size, info.eos_ids)
    hit = _VOCABS.get(key)
    if hit is None:
        hit = (info.tokenizer, build_token_vocab(info.tokenizer, info.vocab_size, set(info.eos_ids)))
        _VOCABS[key] = hit
    return hit[1]
