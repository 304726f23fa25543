"""Decides when a request is finished: length, EOS / stop ids, stop strings, grammar end."""

from __future__ import annotations

import logging
from typing import Callable

from radixflow.runtime.scheduling.req import Req

log = logging.getLogger(__name__)

# transformers' modules whose decode / _decode hand the ids to the tokenizers backend as they are
_STOCK_DECODE = ("transformers.tokenization_utils_base", "transformers.tokenization_utils_tokenizers",
                 "transformers.tokenization_utils_fast")  # fmt: skip


# every pattern transformers' clean_up_tokenization rewrites
_CLEAN_UP_PROBE = "a . b , c ! d ? e 's f n't g 'm h 've i 're j"


def backend_decode(tokenizer) -> Callable[[list, bool], str]:
    """decode(ids, skip_special_tokens) giving tokenizer.decode's text. Where that is the tokenizers
    backend's decode unchanged (a fast tokenizer, its decode and _decode transformers' own, whose
    space clean-up is off or, checked once on a probe, changes nothing: transformers 5 skips it for
    BPE models), the backend is called directly: transformers' wrapper costs several times the
    decode itself, on every token of every request with stop strings."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    stock = all(_defined_in(type(tokenizer), name) in _STOCK_DECODE for name in ("decode", "_decode"))
    slow = lambda ids, skip: tokenizer.decode(ids, skip_special_tokens=skip)  # noqa: E731
    if backend is None or not stock:
        return slow
    fast = lambda ids, skip: backend.decode(ids, skip_special_tokens=skip)  # noqa: E731
    if getattr(tokenizer, "clean_up_tokenization_spaces", True) is not False:
        probe = backend.encode(_CLEAN_UP_PROBE, add_special_tokens=False).ids + sorted(set(tokenizer.all_special_ids))
        if any(fast(probe, skip) != slow(probe, skip) for skip in (True, False)):
            return slow
    return fast


def _defined_in(cls: type, name: str) -> str:
    owner = next((c for c in cls.__mro__ if name in c.__dict__), None)
    return "" if owner is None else owner.__module__


class StopChecker:
    def __init__(self, tokenizer, eos_ids: set):
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self._decode = backend_decode(tokenizer)

    def check(self, req: Req, context_len: int) -> None:
        if req.finished:
            return
        p = req.sampling
        last = req.output_ids[-1]
        stop_token = (last in self.eos_ids and not p.ignore_eos) or (p.stop_token_ids and last in p.stop_token_ids)
        grammar_done = req.grammar is not None and req.grammar.is_terminated()  # asked once: every row, every step
        if req.grammar is not None and (stop_token or grammar_done) and self._grammar_failed(req):
            return
        if req.grammar is not None and req.grammar.budget_closed and (stop_token or grammar_done):
            # complete for the grammar, but cut short to fit max_new_tokens: a length finish
            req.finish({"type": "length", "length": p.max_new_tokens, "grammar_closed": True,
                        "matched": last if stop_token else None})  # fmt: skip
            return
        if stop_token:
            req.finish({"type": "stop", "matched": last})
            return
        if grammar_done:
            # the last token is part of the grammar's output (not a stop token): keep it
            req.finish({"type": "stop", "matched": None})
            return
        if p.stop_strs:
            matched = self._stop_str(req)
            if matched is not None:
                req.finish({"type": "stop", "matched": matched})
                return
        # after the stop checks: a stop matched by the last allowed token still counts as a stop
        if req.segment_len >= p.max_new_tokens:
            closed = {"grammar_closed": True} if req.grammar is not None and req.grammar.budget_closed else {}
            req.finish({"type": "length", "length": p.max_new_tokens, **closed})
        elif req.seq_len >= context_len:
            req.finish({"type": "length", "length": len(req.output_ids)})

    @staticmethod
    def _grammar_failed(req: Req) -> bool:
        """A grammar row ending while its matcher is broken (a parser error, a rejected token)
        fails with a server error: its output is incomplete, not a finished answer."""
        error = req.grammar.error()
        if error is None:
            return False
        log.error("request %s: constrained decoding failed: %s", req.rid, error)
        req.finish({"type": "abort", "message": f"constrained decoding failed: {error}", "status_code": 500})
        return True

    def _stop_str(self, req: Req):
        longest = max(len(s) for s in req.sampling.stop_strs)
        # every token decodes to >= 1 char, so this many tokens cover any new match
        tail_ids = req.output_ids[max(req.segment_start, len(req.output_ids) - longest - 2) :]
        tail = self._decode(tail_ids, req.sampling.skip_special_tokens)
        for s in req.sampling.stop_strs:
            if s in tail:
                return s
        return None
