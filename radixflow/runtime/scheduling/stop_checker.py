"""Decides when a request is finished: length, EOS / stop ids, stop strings, stop regexes, grammar end."""

from __future__ import annotations

import logging
from typing import Callable

from radixflow.runtime.scheduling.req import Req
from radixflow.runtime.stop_regex import TAIL_WIDTH, UNBOUNDED_WINDOW, first_match
from radixflow.runtime.stop_regex_search import GrowingText

log = logging.getLogger(__name__)

# transformers' modules whose decode / _decode hand the ids to the tokenizers backend as they are
_STOCK_DECODE = ("transformers.tokenization_utils_base", "transformers.tokenization_utils_tokenizers",
                 "transformers.tokenization_utils_fast")  # fmt: skip


# llguidance's errors for a grammar past its Earley parser's limits, met only while decoding: a row's limit
# ("Current row has 3001 items; max is 2000": a 3,000-alternative EBNF rule passes its validation) and the items
# one step may add ("Too many items (limit 50000; ff_tokens)": `root ::= "a" root` forces "a" forever)
_PARSER_LIMITS = ("items; max is", "Too many items (limit")

# text whose decode the space clean-up changes (" ." -> ".", " n't" -> "n't", ...), for _same_text's probe
_CLEANUP_PROBE = "a . b , c ! d ? e n't f 's g 'm h 've i 're j ' k"


def backend_decode(tokenizer) -> Callable[[list, bool], str]:
    """decode(ids, skip_special_tokens) giving tokenizer.decode's text. Where that is the tokenizers
    backend's decode unchanged (decode_backend), the backend is called directly: transformers'
    wrapper costs several times the decode itself, on every token of every request with stop strings."""
    return decode_with(tokenizer, decode_backend(tokenizer))


def decode_with(tokenizer, backend) -> Callable[[list, bool], str]:
    """decode(ids, skip_special_tokens) through `backend` (decode_backend's answer), or transformers' if None."""
    if backend is None:
        return lambda ids, skip: tokenizer.decode(ids, skip_special_tokens=skip)
    return lambda ids, skip: backend.decode(ids, skip_special_tokens=skip)


def decode_backend(tokenizer):
    """The tokenizers backend if its decode gives tokenizer.decode's text (a fast tokenizer whose
    decode and _decode are transformers' own, and which cleans up no spaces or whose clean-up
    transformers skips, as for BPE tokenizers), else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    stock = all(_defined_in(type(tokenizer), name) in _STOCK_DECODE for name in ("decode", "_decode"))
    fast = backend is not None and stock
    if fast and getattr(tokenizer, "clean_up_tokenization_spaces", True) is not False:
        fast = _same_text(tokenizer, backend)
    return backend if fast else None


def _same_text(tokenizer, backend) -> bool:
    """Whether transformers' decode (with its space clean-up, where it applies it) gives the backend's
    text on a probe that the clean-up would change, with and without special tokens."""
    ids = backend.encode(_CLEANUP_PROBE, add_special_tokens=False).ids
    special = sorted(set(getattr(tokenizer, "all_special_ids", [])))[:4]
    probes = [ids, special + ids + special, ids[: len(ids) // 2]]
    return all(tokenizer.decode(p, skip_special_tokens=skip) == backend.decode(p, skip_special_tokens=skip)
               for p in probes for skip in (True, False))  # fmt: skip


def _defined_in(cls: type, name: str) -> str:
    owner = next((c for c in cls.__mro__ if name in c.__dict__), None)
    return "" if owner is None else owner.__module__


def _drop_outputs(req: Req, keep: int) -> None:
    req.cut_outputs(keep)


class StopChecker:
    def __init__(self, tokenizer, eos_ids: set, rewind: Callable[[Req, int], None] | None = None):
        """`rewind(req, keep)`: drops outputs past `keep` and their KV (Scheduler.rewind; None: the outputs only, for
        requests that hold no KV)."""
        self.eos_ids = eos_ids
        self._decode = backend_decode(tokenizer)
        self._rewind = rewind or _drop_outputs

    def check(self, req: Req, seq_limit: int) -> None:
        """Checks the outputs appended (or put in place of cut ones) since this request's last check: a sampled
        token, a jump's tokens, a grammar's first jump appended before the first sample (req.stop_checked)."""
        if req.finished:
            return
        added = max(1, len(req.output_ids) - max(req.stop_checked, req.segment_start))
        req.stop_checked = len(req.output_ids)
        p = req.sampling
        last = req.output_ids[-1]
        stop_token = (last in self.eos_ids and not p.ignore_eos) or (p.stop_token_ids and last in p.stop_token_ids)
        grammar_done = req.grammar is not None and req.grammar.is_terminated()  # asked once: every row, every step
        if req.grammar is not None and (stop_token or grammar_done) and self._grammar_failed(req):
            return
        if (grammar_done and not stop_token or stop_token and added > 1) and (matched := self._stop_match(req, added)) is not None:
            # the grammar's last token, or jumped tokens before a stop token, complete a stop string: it ends the output,
            # as it would have one token earlier (fuzzing: regex "(yes|no)" with stop "o" gave "no", matched null)
            self._finish_at_stop(req, added, matched)
            return
        if req.grammar is not None and req.grammar.budget_closed and (stop_token or grammar_done):
            # complete for the grammar, but cut short to fit max_new_tokens: a length finish
            req.finish({"type": "length", "length": p.max_new_tokens, "grammar_closed": True, "matched": None})
            return
        if stop_token:
            req.finish({"type": "stop", "matched": last})
            return
        if grammar_done:
            # the last token is part of the grammar's output (not a stop token): keep it
            req.finish({"type": "stop", "matched": None})
            return
        matched = self._stop_match(req, added)
        if matched is not None:
            self._finish_at_stop(req, added, matched)
            return
        if req.grammar is not None and req.grammar.undo:  # a budget repair is due (the jump hook's, next): the
            return  # token it replaces ends nothing by length; a stop it made above still counts, as in a lazy check
        # after the stop checks: a stop matched by the last allowed token still counts as a stop
        if req.segment_len >= p.max_new_tokens:
            closed = {"grammar_closed": True, "matched": None} if req.grammar is not None and req.grammar.budget_closed else {}
            req.finish({"type": "length", "length": p.max_new_tokens, **closed})
        elif req.seq_len >= seq_limit:
            req.finish({"type": "length", "length": req.segment_len})

    @staticmethod
    def _grammar_failed(req: Req) -> bool:
        """A grammar row ending while its matcher is broken (a parser error, a rejected token)
        fails with a server error: its output is incomplete, not a finished answer."""
        error = req.grammar.error()
        if error is None:
            return False
        if any(limit in error for limit in _PARSER_LIMITS):  # the grammar's size, not the server: the request's to change
            req.finish({"type": "abort", "status_code": 400, "message": f"the grammar is over the parser's limits "
                        f"({error}); simplify it: fewer alternatives in one rule, longer lexemes, no rule that only repeats itself"})  # fmt: skip
            return True
        log.error("request %s: constrained decoding failed: %s", req.rid, error)
        req.finish({"type": "abort", "message": f"constrained decoding failed: {error}", "status_code": 500})
        return True

    def _finish_at_stop(self, req: Req, added: int, matched) -> None:
        """Finish on the stop `matched`. Where the outputs up to an earlier one of the `added` already complete it
        (tokens a grammar jumped over, and what followed them), the output is cut back to that one, where a request
        that sampled them (one with logprobs: it does not jump) stops (fuzzing: 31 ids for its 13, and a sampled
        token after the stop)."""
        first = len(req.output_ids) - added
        end, matched = self._first_end(req, first, matched) if added > 1 else (len(req.output_ids), matched)
        if end < len(req.output_ids):
            req.drop_output_logprobs(len(req.output_ids) - end)  # a budget repair's tokens may have entries
            self._rewind(req, end)
        req.finish({"type": "stop", "matched": matched})

    def _first_end(self, req: Req, first: int, matched) -> tuple:
        """The fewest outputs (past `first`) that complete a stop, and the stop they complete (`matched`: all of
        them): a binary search over stop strings (a match, once there, stays), a scan from the shortest where a
        stop_regex may match at some ends only (`$`, `\\b`, a lookahead: the review of session 28 found `cat$` kept
        7 jumped tokens where sampling stopped after 1)."""
        total = len(req.output_ids)
        if req.sampling.stop_patterns is not None:
            for end in range(first + 1, total):
                if (found := self._stop_match(req, end - first, end)) is not None:
                    return end, found
            return total, matched
        lo, hi = first + 1, total  # hi completes `matched`
        while lo < hi:
            mid = (lo + hi) // 2
            if (found := self._stop_match(req, mid - first, mid)) is not None:
                hi, matched = mid, found
            else:
                lo = mid + 1
        return hi, matched

    def _stop_match(self, req: Req, added: int, end: int | None = None):
        """The stop string or stop_regex match that the `added` tokens complete, or None; with `end`, in the outputs
        before it (the `added` are the last of those)."""
        p = req.sampling
        matched = self._stop_str(req, added, end) if p.stop_strs else None
        if matched is None and p.stop_patterns is not None:
            width = p.stop_patterns.width  # characters: at most 4 bytes each
            if width is not None:
                matched = first_match(p.stop_patterns, self._tail(req, added, 4 * width, end))
            elif end is not None:  # searched from the window's start as the per-token check is (`^` is no match there)
                text = self._decoded_until(req, end)
                matched = first_match(p.stop_patterns, text, max(0, len(text) - UNBOUNDED_WINDOW))
            else:
                kept, stops = self._kept(req), p.stop_patterns
                matched = kept.first_match(stops.patterns, stops.growing, self._kept_text(req))
        return matched

    def _stop_str(self, req: Req, added: int, end: int | None):
        """The stop string the `added` tokens complete; of several, the one that starts first (it is cut there:
        fuzzing found " open" completing stops ["n", "ope"], and the text cut at "n" still held "ope")."""
        nbytes = req.sampling.stop_strs_bytes
        tail = self._tail(req, added, nbytes, end) if nbytes <= 4 * TAIL_WIDTH else self._gen_text(req, end)
        found = [(tail.find(s), -len(s), s) for s in req.sampling.stop_strs if s in tail]
        return min(found)[2] if found else None

    def _tail(self, req: Req, added: int, nbytes: int, end: int | None = None) -> str:
        """The gen's decoded output from where a match of up to `nbytes` bytes of UTF-8 that ends in one of the
        `added` tokens may start, without a last character whose bytes are not all out yet (it decodes as U+FFFD).
        A token decodes to >= 1 byte (skipped special tokens aside): byte-level vocabularies spell a CJK character
        or an emoji in up to 4 tokens, so a match starts within `nbytes` tokens before them, not within its length
        in characters (found by fuzzing: 12 of 13 CJK / emoji stop strings were missed)."""
        end = len(req.output_ids) if end is None else end
        start = max(req.segment_start, end - added - nbytes - 1)
        return self._decode(req.output_ids[start:end], req.sampling.skip_special_tokens).rstrip("\ufffd")

    def _gen_text(self, req: Req, end: int | None = None) -> str:
        """The gen's decoded output, its last UNBOUNDED_WINDOW characters (where a long stop string is searched for):
        the kept text, or with `end` the outputs before it decoded afresh."""
        return (self._kept_text(req) if end is None else self._decoded_until(req, end))[-UNBOUNDED_WINDOW:]

    def _decoded_until(self, req: Req, end: int) -> str:
        """The gen's outputs before `end` decoded afresh (a stop's search for where it completed), without a last
        character whose bytes are not all out yet."""
        return self._decode(req.output_ids[req.segment_start : end], req.sampling.skip_special_tokens).rstrip("\ufffd")

    def _kept_text(self, req: Req) -> str:
        """The gen's whole decoded output as the request keeps it (stop_regex_search.GrowingText), so a check decodes
        only the newest tokens, not the whole gen again (quadratic in its length); outputs cut back drop it."""
        skip = req.sampling.skip_special_tokens
        return self._kept(req).update(req.output_ids, lambda ids: self._decode(ids, skip))

    @staticmethod
    def _kept(req: Req) -> GrowingText:
        if req.stop_text is None or req.stop_text.segment_start != req.segment_start:
            req.stop_text = GrowingText.at(req.segment_start)
        return req.stop_text
