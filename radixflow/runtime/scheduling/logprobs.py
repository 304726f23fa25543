"""Collects input (prompt) and output token logprobs, with optional top-k, per request."""

from __future__ import annotations

import torch

from radixflow.runtime.scheduling.req import Req
from radixflow.runtime.scheduling.sampler import SampleResult

CHUNK_ROWS = 512  # rows per log-softmax in add_inputs (a float copy of 512 x vocab)


class LogprobCollector:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def add_inputs(self, items: list) -> None:
        """Input logprobs for one pass's requests: `items` are (req, logits, start_pos, n), where
        `logits[j]` is the distribution after position start_pos + j (predicting token +1). One
        log-softmax per chunk of rows and one copy to the host for all requests: a select's
        scoring requests (hundreds a pass) would each wait for the GPU otherwise."""
        spans, rows, targets = [], [], []
        for req, logits, start_pos, n in items:
            first, last = self._span(req, start_pos, n)
            if last < first:
                continue
            spans.append((req, first, last))
            rows.append(logits[first - 1 - start_pos : last - start_pos])
            targets.extend(req.origin_input_ids[first : last + 1])
        if not spans:
            return
        device = rows[0].device
        chosen, tops, row, at = [], {}, 0, 0
        target_ids = torch.tensor(targets, device=device)
        for chunk in _chunks(rows):
            lp = torch.log_softmax(torch.cat([rows[i] for i in chunk]).float(), dim=-1)
            m = lp.shape[0]
            chosen.append(lp.gather(1, target_ids[row : row + m].unsqueeze(1)).squeeze(1))
            for i in chunk:
                req, first, last = spans[i]
                if req.logprob.top_logprobs_num:
                    tops[i] = lp[at - row : at - row + last + 1 - first].topk(req.logprob.top_logprobs_num, dim=-1)
                at += last + 1 - first
            row += m
        values = torch.cat(chosen).tolist()
        at = 0
        for i, (req, first, last) in enumerate(spans):
            m = last + 1 - first
            req.input_token_logprobs.extend(zip(values[at : at + m], req.origin_input_ids[first : last + 1]))
            if i in tops:
                req.input_top_logprobs.extend(_pairs(*tops[i]))
            req.input_logprob_next = last + 1
            at += m

    @staticmethod
    def _span(req: Req, start_pos: int, n: int) -> tuple[int, int]:
        """The prompt positions (first, last) whose logprobs this chunk gives; the first prompt
        token has none (None is recorded for it)."""
        if req.input_logprob_next == 0:
            req.input_token_logprobs.append((None, req.origin_input_ids[0]))
            if req.logprob.top_logprobs_num:
                req.input_top_logprobs.append(None)
            req.input_logprob_next = 1
        return req.input_logprob_next, min(start_pos + n, len(req.origin_input_ids) - 1)

    def add_output(self, req: Req, result: SampleResult, row: int, token: int) -> None:
        req.output_token_logprobs.append((float(result.chosen_logprobs[row]), token))
        k = req.logprob.top_logprobs_num
        if k:
            vals, ids = result.logprobs[row].topk(k)
            req.output_top_logprobs.append(list(zip(vals.tolist(), ids.tolist())))

    def with_text(self, pairs: list, want_text: bool) -> list:
        """[(lp, id)] -> [[lp, id, text|None]]."""
        if not want_text:
            return [[lp, tid, None] for lp, tid in pairs]
        return [[lp, tid, self.tokenizer.decode([tid])] for lp, tid in pairs]


def _chunks(rows: list) -> list:
    """Indices of `rows` grouped into chunks of about CHUNK_ROWS rows (bounding the float copy)."""
    out, cur, size = [], [], 0
    for i, r in enumerate(rows):
        if cur and size + r.shape[0] > CHUNK_ROWS:
            out.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += r.shape[0]
    return out + [cur] if cur else out


def _pairs(vals: torch.Tensor, ids: torch.Tensor) -> list:
    return [list(zip(v, i)) for v, i in zip(vals.tolist(), ids.tolist())]
