"""Collects input (prompt) and output token logprobs, with optional top-k and asked-for token ids, per request."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Optional

import torch

from radixflow.host_copy import copy_to_host, to_device_async
from radixflow.runtime.scheduling.req import Req
from radixflow.runtime.scheduling.sampler import SampleResult

CHUNK_ROWS = 512  # rows per logsumexp in add_inputs (bounds its temporaries: 512 x vocab floats)


@dataclass
class PendingInputs:
    """One pass's input logprobs on their way to the host, for `spans` of (req, first, last) prompt positions."""

    spans: list
    values: torch.Tensor  # the spans' logprobs, one after another; valid once `ready` has completed
    ready: Optional[torch.cuda.Event] = None  # None: already on the host

    def apply(self) -> None:
        """Append each span's logprobs to its request (waits for the copy)."""
        if self.ready is not None:
            self.ready.synchronize()
        values, at = self.values.tolist(), 0
        for req, first, last in self.spans:
            m = last + 1 - first
            req.input_token_logprobs.extend(zip(values[at : at + m], req.origin_input_ids[first : last + 1]))
            at += m


class LogprobCollector:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}  # token id -> its text alone, decoded once: a stream's every chunk asks

    def add_inputs(self, logits: torch.Tensor, items: list, defer: bool = False) -> Optional[PendingInputs]:
        """Input logprobs for one pass's requests: `items` are (req, row, start_pos, n), where
        `logits[row + j]` is the distribution after position start_pos + j (predicting token +1).
        A logprob is the target's logit minus its row's logsumexp, read from the pass's rows
        without copying them (no vocabulary-wide log-softmax written out; float32 already), in
        chunks of rows, and copied to the host once for all requests: a select's many scoring
        requests in a pass would each wait for the GPU otherwise. With `defer` (overlapped extend
        passes) the copy is only started and the caller applies the returned PendingInputs after
        launching the next pass, so the host does not wait for this one (a select's scoring passes
        would otherwise each stop the GPU while the next is built); None when applied here. Top
        logprobs are read at once (rare; they wait for the pass), but the token logprobs are still
        deferred: a request's chunks must be applied in pass order."""
        spans, rows, targets = [], [], []
        for req, row, start_pos, n in items:
            first, last = self._span(req, start_pos, n)
            if last < first:
                continue
            spans.append((req, first, last))
            rows.append(range(row + first - 1 - start_pos, row + last - start_pos))
            targets.extend(req.origin_input_ids[first : last + 1])
        if not spans:
            return None
        lo, hi = rows[0].start, rows[-1].stop
        lse = torch.cat([torch.logsumexp(logits[a : min(a + CHUNK_ROWS, hi)], dim=-1) for a in range(lo, hi, CHUNK_ROWS)])
        flat_rows = list(itertools.chain.from_iterable(rows))
        row_ids, target_ids = to_device_async(torch.tensor([flat_rows, targets], dtype=torch.int64), logits.device)
        pending = PendingInputs(spans, *copy_to_host(logits[row_ids, target_ids] - lse[row_ids - lo]))
        for (req, first, last), span_rows in zip(spans, rows):
            if req.logprob.top_logprobs_num:
                req.input_top_logprobs.extend(_top_rows(logits, lse, lo, span_rows, req.logprob.top_logprobs_num))
            if req.logprob.token_ids_logprob:
                req.input_token_ids_logprobs.extend(_id_rows(logits, lse, lo, span_rows, req.logprob.token_ids_logprob))
            req.input_logprob_next = last + 1  # the next chunk's span starts here, applied or not
        if defer:
            return pending
        pending.apply()
        return None

    @staticmethod
    def _span(req: Req, start_pos: int, n: int) -> tuple[int, int]:
        """The prompt positions (first, last) whose logprobs this chunk gives; the first prompt
        token has none (None is recorded for it)."""
        if req.input_logprob_next == 0:
            req.input_token_logprobs.append((None, req.origin_input_ids[0]))
            if req.logprob.top_logprobs_num:
                req.input_top_logprobs.append(None)
            if req.logprob.token_ids_logprob:
                req.input_token_ids_logprobs.append(None)
            req.input_logprob_next = 1
        return req.input_logprob_next, min(start_pos + n, len(req.origin_input_ids) - 1)

    def add_output(self, req: Req, result: SampleResult, row: int, token: int) -> None:
        req.output_token_logprobs.append((float(result.chosen_logprobs[row]), token))
        k = req.logprob.top_logprobs_num
        if k:
            vals, ids = result.logprobs[row].topk(k)
            req.output_top_logprobs.append(list(zip(vals.tolist(), ids.tolist())))
        asked = req.logprob.token_ids_logprob
        if asked:
            ids = _ids_on(asked, result.logprobs.device)
            req.output_token_ids_logprobs.append(list(zip(result.logprobs[row, ids].tolist(), asked)))

    @staticmethod
    def replace_outputs(req: Req, dropped: int, tokens: list) -> None:
        """The grammar cut the last `dropped` outputs and appended `tokens` it chose, unsampled (a budget repair):
        their logprobs are unknown (None), under their own ids, so the lists still match the output (they kept
        the cut tokens' ids; found by fuzzing)."""
        if not req.logprob.return_logprob:
            return
        req.drop_output_logprobs(dropped)
        req.output_token_logprobs.extend((None, t) for t in tokens)
        if req.logprob.top_logprobs_num:
            req.output_top_logprobs.extend([None] * len(tokens))
        if req.logprob.token_ids_logprob:
            req.output_token_ids_logprobs.extend([None] * len(tokens))

    def with_text(self, pairs: list, want_text: bool) -> list:
        """[(lp, id)] -> [[lp, id, text|None]]."""
        if not want_text:
            return [[lp, tid, None] for lp, tid in pairs]
        return [[lp, tid, self.token_text(tid)] for lp, tid in pairs]

    def token_text(self, tid: int) -> str:
        text = self._texts.get(tid)
        if text is None:
            text = self._texts[tid] = self.tokenizer.decode([tid])
        return text


def _top_rows(logits: torch.Tensor, lse: torch.Tensor, lo: int, rows: range, k: int) -> list:
    """The k most likely tokens of each row in `rows` as [(logprob, id)], CHUNK_ROWS rows at a time: a span's
    logprobs are never written out whole ([rows, vocab] floats, 2 GiB at 4,096 rows of a 128k vocabulary)."""
    pairs = []
    for a in range(rows.start, rows.stop, CHUNK_ROWS):
        b = min(a + CHUNK_ROWS, rows.stop)
        pairs += _pairs(*(logits[a:b] - lse[a - lo : b - lo, None]).topk(k, dim=-1))
    return pairs


@functools.lru_cache(maxsize=64)
def _ids_on(asked: tuple, device: torch.device) -> torch.Tensor:
    """The asked ids on the device, made once per id list (a request's every step reads them)."""
    return torch.tensor(asked, device=device)


def _id_rows(logits: torch.Tensor, lse: torch.Tensor, lo: int, rows: range, asked: tuple) -> list:
    """The logprobs of the `asked` token ids in each row of `rows`, as [(logprob, id)] in the asked order."""
    ids = _ids_on(asked, logits.device)
    pairs = []
    for a in range(rows.start, rows.stop, CHUNK_ROWS):
        b = min(a + CHUNK_ROWS, rows.stop)
        values = logits[a:b, ids] - lse[a - lo : b - lo, None]
        pairs += [list(zip(v, asked)) for v in values.tolist()]
    return pairs


def _pairs(vals: torch.Tensor, ids: torch.Tensor) -> list:
    return [list(zip(v, i)) for v, i in zip(vals.tolist(), ids.tolist())]
