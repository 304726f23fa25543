"""The scheduler's grammar seam: submit a constrained request, poll until its grammar is
compiled (or failed), and jump forward after sampled tokens.

    backend = GrammarBackend(tokenizer, vocab_size, eos_ids, server_args)
    backend.submit(req)          # starts compiling (or finds it in the cache)
    backend.poll(req)            # None: compiling; True: req.grammar set; False: req finished (400)
    backend.jump_forward(req)    # [] / [tokens] / (keep, [tokens])
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import time
import weakref
from concurrent.futures import Future
from typing import Optional, Union

from radixflow.constrained.cache import GrammarCache
from radixflow.constrained.fsm import CompiledGrammar, compile_regex
from radixflow.constrained.json_any import DEFAULT_DEPTH
from radixflow.constrained.json_schema import COMPACT_WHITESPACE
from radixflow.constrained.jump_forward import plan_jump
from radixflow.constrained.matcher import GrammarMatcher
from radixflow.constrained.spec import regex_error, to_regex
from radixflow.constrained.vocabulary import TokenVocab, build_token_vocab
from radixflow.errors import RadixflowError

log = logging.getLogger(__name__)


class GrammarBackend:
    def __init__(self, tokenizer, vocab_size: int, eos_ids: set, server_args=None, whitespace: Optional[str] = None):
        """`whitespace`: the JSON whitespace pattern; None takes the server's
        constrained_json_whitespace_pattern (itself None = compact JSON)."""
        self.tokenizer = tokenizer
        if whitespace is None:
            whitespace = getattr(server_args, "constrained_json_whitespace_pattern", None)
        self.whitespace = whitespace or COMPACT_WHITESPACE
        self.any_depth = getattr(server_args, "constrained_json_any_depth", DEFAULT_DEPTH)
        self.jump_enabled = not getattr(server_args, "disable_jump_forward", False)
        self.cache = GrammarCache(getattr(server_args, "grammar_compile_workers", 2))
        # the vocabulary is built by the pool too, ahead of any compile job (FIFO)
        self._vocab: Future = self.cache.pool.submit(build_token_vocab, tokenizer, vocab_size, set(eos_ids))
        self._jobs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    @property
    def vocab(self) -> TokenVocab:
        return self._vocab.result()

    # -- compile ---------------------------------------------------------------------------------
    def submit(self, req) -> None:
        kind, spec = req.sampling.grammar
        self._jobs[req] = self.compile_async(kind, spec)

    def compile_async(self, kind: str, spec) -> Future:
        key = (kind, spec, self.whitespace, self.any_depth)
        return self.cache.get(key, lambda: self._compile(kind, spec))

    def compile(self, kind: str, spec) -> CompiledGrammar:
        """Blocking; raises RadixflowError."""
        return self.compile_async(kind, spec).result()

    def _compile(self, kind: str, spec) -> CompiledGrammar:
        start = time.perf_counter()
        regex = to_regex(kind, spec, self.whitespace, self.any_depth)
        try:
            grammar = compile_regex(regex, self.vocab)
        except ValueError as e:
            raise RadixflowError(regex_error(regex, str(e))) from None
        grammar.compile_s = time.perf_counter() - start
        return grammar

    # -- the scheduler's calls -------------------------------------------------------------------------
    def poll(self, req) -> Optional[bool]:
        fut = self._jobs.get(req)
        if fut is None or not fut.done():
            return None
        del self._jobs[req]
        error = fut.exception()
        if error is not None:
            return self._reject(req, _message(error))
        grammar: CompiledGrammar = fut.result()
        budget = req.sampling.max_new_tokens - req.segment_len
        if grammar.min_tokens > budget:
            return self._reject(
                req,
                f"max_new_tokens={req.sampling.max_new_tokens} is too small for this grammar: its shortest "
                f"output takes {grammar.min_tokens} tokens; raise max_new_tokens to at least {grammar.min_tokens}",
            )
        req.grammar = GrammarMatcher(grammar, req)
        if self.jump_enabled:
            forced = plan_jump(req.grammar, req, self._encode, first=True)
            if forced:
                req.output_ids.extend(forced)
                req.jump_forward_tokens += len(forced)
        return True

    def wait(self, reqs: list, timeout: float) -> None:
        """Block until one of `reqs`' grammars is compiled, or `timeout` seconds (for an
        idle scheduler, instead of spinning while the compile threads need the CPU)."""
        jobs = [self._jobs[r] for r in reqs if r in self._jobs]
        if jobs:
            concurrent.futures.wait(jobs, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)

    def jump_forward(self, req) -> Union[list, tuple]:
        if req.grammar is None or req.grammar.is_terminated():
            return []
        return plan_jump(req.grammar, req, self._encode)

    def _encode(self, text: str) -> list:
        return list(self._encode_cached(text))

    @functools.lru_cache(maxsize=8192)  # noqa: B019 - one backend per scheduler, kept for its life
    def _encode_cached(self, text: str) -> tuple:
        """A jump's text (last token + forced bytes) recurs across requests of a grammar."""
        return tuple(self.tokenizer.encode(text, add_special_tokens=False))

    @staticmethod
    def _reject(req, message: str) -> bool:
        req.finish({"type": "abort", "message": message, "status_code": 400})
        return False


def _message(error: BaseException) -> str:
    if isinstance(error, RadixflowError):
        return str(error)
    log.exception("grammar compilation failed", exc_info=error)
    return f"the grammar could not be compiled ({type(error).__name__}: {error}); simplify it"
