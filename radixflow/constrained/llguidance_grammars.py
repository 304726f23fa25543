"""The llguidance grammar backend (PyPI `llguidance`): JSON schema, regex and Lark/GBNF
grammars compiled into an Earley parser over the model's tokens.

Compiling is building an `LLMatcher` and its first mask; a request gets a deep copy of
that compiled matcher. Masks are computed per step straight into the packed int32
bitmask (llguidance drops the GIL while it does). Jump-forward uses llguidance's forced
tokens. Budget-aware completion is not available here: llguidance has no distance to an
accepting state, so `min_tokens` is unknown and a request cut by max_new_tokens may end
in unfinished JSON (use the outlines backend where that matters).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch
from llguidance import LLExecutor, LLMatcher, LLParserLimits, LLTokenizer
from llguidance.gbnf_to_lark import any_to_lark

from radixflow.constrained.grammar_errors import grammar_error
from radixflow.constrained.options import GrammarOptions, TokenizerInfo
from radixflow.constrained.spec import strip_anchors
from radixflow.errors import GrammarError


MAX_UPFRONT_CHARS = 20_000  # validate_grammar runs on the request path: keep it to milliseconds


@dataclass(eq=False)
class LLGuidanceGrammar:
    kind: str
    text: str  # llguidance's grammar (JSON), as compiled
    compiled: LLMatcher  # fresh, first mask computed; requests take deep copies
    words: int
    min_tokens: Optional[int] = None  # unknown to llguidance
    compile_s: float = 0.0


class LLGuidanceMatcher:
    """Per-request state (what `req.grammar` is), with GrammarMatcher's interface."""

    masks_cached = False  # each mask is computed afresh, straight into the bitmask row
    budget_closed = False  # llguidance has no distance to an accepting state: it never closes early

    def __init__(self, grammar: LLGuidanceGrammar, eos_ids: tuple, req=None):
        self.grammar = grammar
        self.req = req
        self.eos_ids = eos_ids
        self.m = grammar.compiled.deep_copy()
        self.ended = False
        self.rejected_token = None

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        assert bitmask.shape[1] == self.grammar.words, "the bitmask is sized for another vocabulary"
        if bitmask.is_cpu and bitmask.is_contiguous() and bitmask.dtype == torch.int32:
            self.m.unsafe_compute_mask_ptr(bitmask[row].data_ptr(), self.grammar.words * 4)
        else:
            bitmask[row].copy_(torch.from_numpy(self.current_mask()))

    @staticmethod
    def fill_rows(pairs: list, bitmask: torch.Tensor) -> None:
        """(matcher, row) pairs into a contiguous CPU int32 bitmask, on llguidance's
        threads (the GIL is released while they run)."""
        assert bitmask.is_cpu and bitmask.is_contiguous() and bitmask.dtype == torch.int32
        words = bitmask.shape[1]
        assert all(m.grammar.words == words for m, _ in pairs), "the bitmask is sized for another vocabulary"
        _executor().unsafe_compute_mask_ptr([(m.m, row) for m, row in pairs], bitmask.data_ptr(), words * 4, bitmask.shape[0])

    def current_mask(self) -> np.ndarray:
        mask = np.zeros(self.grammar.words, dtype=np.int32)
        self.m.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        return mask

    def accept_token(self, token: int) -> None:
        if self.ended:
            return
        if token in self.eos_ids:
            self.ended = True
            return
        if not self.m.consume_token(token):
            self.ended = True
            self.rejected_token = token

    def is_terminated(self) -> bool:
        return self.ended or self.m.is_stopped()

    @property
    def is_accepting(self) -> bool:
        return not self.m.is_error() and self.m.is_accepting()


class LLGuidanceGrammars:
    name = "llguidance"

    def __init__(self, info: TokenizerInfo):
        self.info = info
        self.tokenizer = _ll_tokenizer(info)
        self.words = (info.vocab_size + 31) // 32
        self.limits = LLParserLimits()

    def compile(self, kind: str, spec: Any, options: GrammarOptions) -> LLGuidanceGrammar:
        text = self._grammar_text(kind, spec, options)
        m = LLMatcher(self.tokenizer, text, log_level=0, limits=self.limits)
        if not m.is_error():
            probe = np.zeros(self.words, dtype=np.int32)  # the first mask is part of the compile
            m.unsafe_compute_mask_ptr(probe.ctypes.data, probe.nbytes)
            m.reset()
        if m.is_error():
            raise _error(kind, spec, m.get_error())
        return LLGuidanceGrammar(kind, text, m, self.words)

    def matcher(self, grammar: LLGuidanceGrammar, req=None) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(grammar, self.info.eos_ids, req)

    def jump(self, matcher: LLGuidanceMatcher, req, first: bool = False) -> list:
        """The tokens the grammar forces next (as many as the token budget leaves room for)."""
        if matcher.is_terminated():
            return []
        forced = matcher.m.compute_ff_tokens()
        room = req.sampling.max_new_tokens - req.segment_len - (1 if first else 0)
        forced = forced[: max(room, 0)]
        if not forced or not matcher.m.consume_tokens(forced):
            return []
        return forced

    @staticmethod
    def _grammar_text(kind: str, spec: Any, options: GrammarOptions) -> str:
        if kind == "json_schema":
            try:
                return LLMatcher.grammar_from_json_schema(spec, defaults=_json_options(options))
            except ValueError as e:
                raise GrammarError(f"json_schema is not a valid JSON object: {e}") from None
        if kind == "regex":
            return LLMatcher.grammar_from_regex(strip_anchors(spec))
        if kind == "ebnf":
            return LLMatcher.grammar_from_lark(_lark(spec))
        raise GrammarError(f"unknown grammar kind {kind!r}")


def _lark(text: str) -> str:
    try:
        return any_to_lark(text) if "::=" in text else text  # GBNF (`root ::= ...`) is converted
    except Exception as e:  # the converter's own parse errors
        raise GrammarError(f"invalid ebnf grammar: {e}") from None


def _json_options(options: GrammarOptions) -> dict:
    if not options.whitespace:
        return {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
    return {"whitespace_flexible": True, "whitespace_pattern": options.whitespace}


def _error(kind: str, spec: Any, detail: str) -> GrammarError:
    if kind == "json_schema":
        return grammar_error(detail, spec)
    first = (detail.strip().splitlines() or ["cannot be compiled"])[0]
    what = {"regex": "regex", "ebnf": "ebnf grammar (llguidance Lark syntax, or GBNF)"}[kind]
    return GrammarError(f"invalid or unsupported {what}: {first}")


_TOKENIZERS: dict = {}
_EXECUTORS: list = []


def _executor() -> LLExecutor:
    """llguidance's thread pool for batched mask fills (one per process, built on first use)."""
    if not _EXECUTORS:
        _EXECUTORS.append(LLExecutor())
    return _EXECUTORS[0]


def _ll_tokenizer(info: TokenizerInfo) -> LLTokenizer:
    """Built once per tokenizer (about a second), from the fast tokenizer's JSON."""
    key = (id(info.tokenizer), info.vocab_size, info.eos_ids)
    hit = _TOKENIZERS.get(key)
    if hit is None:
        backend = getattr(info.tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise GrammarError("the llguidance grammar backend needs a fast (tokenizer.json) tokenizer")
        backend = copy.copy(backend)
        backend.no_padding()
        backend.no_truncation()
        hit = (info.tokenizer, LLTokenizer(backend.to_str(), n_vocab=info.vocab_size, eos_token=list(info.eos_ids)))
        _TOKENIZERS[key] = hit
    return hit[1]


def validate_grammar(kind: str, spec: Any, options: GrammarOptions = GrammarOptions()) -> None:
    """The up-front check (no tokenizer; milliseconds). Raises GrammarError."""
    from radixflow.constrained.grammar import check_spec

    check_spec(kind, spec)
    text = LLGuidanceGrammars._grammar_text(kind, spec, options)
    if len(text) > MAX_UPFRONT_CHARS:  # large grammars are checked by their compile, on the worker pool
        return
    error = LLMatcher.validate_grammar(text)
    if error:
        raise _error(kind, spec, error)
