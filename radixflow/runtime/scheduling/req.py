"""A request's state as it moves through the scheduler, and the outputs it reports."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable, Optional

from radixflow.runtime.sampling_params import SamplingParams

if TYPE_CHECKING:  # annotations only: the detokenizer and the HTTP process import this module without torch
    import torch


def max_request_tokens(context_len: int, pool_slots: int) -> int:
    """The most tokens a request may hold: its context, or the whole KV pool (the last token needs no KV). A request
    that outgrew the pool was retracted and never admitted again, and every request queued behind it waited for ever
    (fuzzing, session 29); it now finishes there with "length", as SGLang caps max_new_tokens by the pool."""
    return min(context_len, pool_slots + 1)


def over_limit(tokens: int, context_len: int, pool_slots: int) -> Optional[str]:
    """What a prompt of `tokens` tokens reaches, if it is too long to be served (None if it fits): a prompt needs
    room for one output token within the context, and KV for all its tokens in the pool."""
    if tokens >= context_len:
        return f"the context length is {context_len}"
    if tokens >= pool_slots:
        return f"the KV pool holds {pool_slots} (raise max_total_tokens)"
    return None


class ReqState(Enum):
    GRAMMAR_PENDING = "grammar_pending"
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class LogprobOptions:
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: output tokens only; 0: the whole prompt
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    token_ids_logprob: Optional[tuple] = None  # token ids whose logprobs every reported position also gives


@dataclass(eq=False)
class Req:
    rid: str
    origin_input_ids: list
    sampling: SamplingParams
    logprob: LogprobOptions = field(default_factory=LogprobOptions)
    output_ids: list = field(default_factory=list)
    state: ReqState = ReqState.WAITING
    finish_reason: Optional[dict] = None
    created: float = field(default_factory=time.time)
    first_token_time: Optional[float] = None
    arrival_seq: int = 0  # admission order, for fcfs and for retracting the newest

    # KV bookkeeping (owned by the scheduler)
    req_pool_idx: Optional[int] = None
    kv_len: int = 0  # tokens whose KV slots are in req_to_token[req_pool_idx]
    tree_len: int = 0  # leading tokens whose slots belong to the radix tree (locked path)
    last_node: Any = None
    cached_tokens: int = 0
    admitted_prefix: int = 0  # cached tokens it found when last admitted: KV it did not compute (kv_reserve.py)
    num_retractions: int = 0

    # sampling state
    grammar: Any = None  # constrained-decoding matcher, if any
    output_counts: Optional[torch.Tensor] = None  # [V] counts of output tokens (penalties), sampled or jumped
    counted: int = 0  # how many of output_ids output_counts holds (fewer after a jump: the rest are added)
    prompt_mask: Optional[torch.Tensor] = None  # [V] bool, tokens of the prompt (repetition penalty)
    jump_forward_tokens: int = 0
    stop_checked: int = 0  # output tokens the stop checker has seen (a grammar's first jump is appended unchecked)
    # request graphs run several gen segments in one request: limits count from here
    segment_start: int = 0
    segment_retractions: int = 0  # num_retractions when the segment started: a gen's meta counts its own
    continuable: bool = False  # a request graph's: the scheduler's continue_request may extend it
    streamed: bool = False  # its outputs are shown as they grow: nothing already shown may be cut back

    # logprobs, filled as they are computed
    input_token_logprobs: list = field(default_factory=list)  # [(logprob|None, id)]
    input_top_logprobs: list = field(default_factory=list)
    input_token_ids_logprobs: list = field(default_factory=list)
    output_token_logprobs: list = field(default_factory=list)
    output_top_logprobs: list = field(default_factory=list)
    output_token_ids_logprobs: list = field(default_factory=list)
    input_logprob_next: int = -1  # next prompt position whose logprob is still to report
    cuts: int = 0  # times its output ids or their logprobs were cut back: a stream's next report and text start over
    # called once each time the request finishes (request graphs: wakes its program); never pickled
    on_finish: Optional[Callable[["Req"], None]] = field(default=None, repr=False)
    # admission's last match while it waits ((limit, seq_len), MatchResult: kv_manager.match_waiting); never pickled
    waiting_match: Optional[tuple] = field(default=None, repr=False)
    # the gen's text for unbounded stop_regex patterns and long stop strings (stop_regex_search.GrowingText:
    # stop_checker.py); dropped whenever outputs are cut back
    stop_text: Any = field(default=None, repr=False)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "on_finish": None, "waiting_match": None}

    @property
    def fill_ids(self) -> list:
        """All tokens whose KV this request needs (prompt, then outputs so far)."""
        return self.origin_input_ids + self.output_ids

    def token_range(self, start: int, end: int) -> list:
        """fill_ids[start:end], copying only those tokens (fill_ids copies the whole sequence)."""
        n_prompt = len(self.origin_input_ids)
        if start >= n_prompt:
            return self.output_ids[start - n_prompt : max(end - n_prompt, 0)]
        if end <= n_prompt:
            return self.origin_input_ids[start:end]
        return self.origin_input_ids[start:] + self.output_ids[: end - n_prompt]

    def pending_ids(self) -> list:
        """Tokens still without KV (usually just the last sampled one); O(pending)."""
        return self.token_range(self.kv_len, self.seq_len)

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def segment_len(self) -> int:
        """Tokens generated in the current gen segment."""
        return len(self.output_ids) - self.segment_start

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def needs_input_logprobs(self) -> bool:
        return (
            self.logprob.return_logprob
            and self.logprob.logprob_start_len >= 0
            and 0 <= self.input_logprob_next < len(self.origin_input_ids)
        )

    def cut_outputs(self, keep: int) -> None:
        """Drop the output ids past `keep` (not their logprobs: drop_output_logprobs)."""
        if keep < len(self.output_ids):
            del self.output_ids[keep:]
            self.cuts += 1

    def drop_output_logprobs(self, n: int) -> None:
        """Drop the logprob entries of the last `n` outputs (cut back), so the lists still match output_ids."""
        for entries in (self.output_token_logprobs, self.output_top_logprobs, self.output_token_ids_logprobs):
            if n > 0 and entries:
                del entries[len(entries) - min(n, len(entries)):]
                self.cuts += 1

    def finish(self, reason: dict) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason
            if self.on_finish is not None:
                self.on_finish(self)

    def to_output(self) -> ReqOutput:
        """What the scheduler reports for this request after a step."""
        return ReqOutput(
            rid=self.rid,
            output_ids=self.output_ids,  # by reference: copied only when sent
            finished=self.finished,
            finish_reason=self.finish_reason,
            prompt_tokens=len(self.origin_input_ids),
            cached_tokens=self.cached_tokens,
            new_output_token_logprobs=self.output_token_logprobs,
            new_output_top_logprobs=self.output_top_logprobs,
            new_output_token_ids_logprobs=self.output_token_ids_logprobs,
            input_token_logprobs=self.input_token_logprobs,
            input_top_logprobs=self.input_top_logprobs,
            input_token_ids_logprobs=self.input_token_ids_logprobs,
            num_retractions=self.num_retractions,
            jump_forward_tokens=self.jump_forward_tokens,
            cuts=self.cuts,
        )


@dataclass
class ReqOutput:
    """What the scheduler reports for a request after a step (new tokens and state)."""

    rid: str
    output_ids: list
    finished: bool
    finish_reason: Optional[dict]
    prompt_tokens: int
    cached_tokens: int
    new_output_token_logprobs: list = field(default_factory=list)
    new_output_top_logprobs: list = field(default_factory=list)
    new_output_token_ids_logprobs: list = field(default_factory=list)
    input_token_logprobs: Optional[list] = None
    input_top_logprobs: Optional[list] = None
    input_token_ids_logprobs: Optional[list] = None
    num_retractions: int = 0
    jump_forward_tokens: int = 0
    error: Optional[str] = None
    cuts: int = 0  # the request's cuts (Req.cuts) when reported: a stream's sender sees its outputs cut back
    # None: the lists above are whole; else where each starts (output_delta._LISTS' order): a streamed request's
    # report carries what they gained since its last (runtime/output_delta.py)
    starts: Optional[tuple] = None
