"""Collects input (prompt) and output token logprobs, with optional top-k, per request."""

from __future__ import annotations

import torch

from radixflow.runtime.scheduling.req import Req
from radixflow.runtime.scheduling.sampler import SampleResult


class LogprobCollector:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def add_input(self, req: Req, logits: torch.Tensor, start_pos: int, n: int) -> None:
        """`logits[j]` is the distribution after position start_pos + j (predicting token +1)."""
        prompt = req.origin_input_ids
        if req.input_logprob_next == 0:
            req.input_token_logprobs.append((None, prompt[0]))
            if req.logprob.top_logprobs_num:
                req.input_top_logprobs.append(None)
            req.input_logprob_next = 1
        first = req.input_logprob_next  # token position to report next
        last = min(start_pos + n, len(prompt) - 1)  # last token position predicted here
        if last < first:
            return
        rows = torch.arange(first - 1 - start_pos, last - start_pos, device=logits.device)
        lp = torch.log_softmax(logits[rows].float(), dim=-1)
        targets = torch.tensor(prompt[first : last + 1], device=logits.device)
        chosen = lp.gather(1, targets.unsqueeze(1)).squeeze(1).tolist()
        req.input_token_logprobs.extend(zip(chosen, prompt[first : last + 1]))
        k = req.logprob.top_logprobs_num
        if k:
            vals, ids = lp.topk(k, dim=-1)
            req.input_top_logprobs.extend(_pairs(vals, ids))
        req.input_logprob_next = last + 1

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


def _pairs(vals: torch.Tensor, ids: torch.Tensor) -> list:
    return [list(zip(v, i)) for v, i in zip(vals.tolist(), ids.tolist())]
