"""Batched sampling: penalties -> grammar mask -> logit bias -> temperature / top-k / top-p / min-p.

Everything is done on `[B, V]` tensors; the only Python loops run over requests
(never over the vocabulary), and only for requests that need per-row work
(grammar masks, logit bias). On CUDA, sampled rows are drawn by a Triton kernel that needs no
sort (kernels/sampling.py). Its GPU time was several times below torch's path when that path
drew with torch.multinomial; against the inverse-CDF draw that replaced it only host-bound call
times have been measured, so the GPU-time gap now is unknown (benchmarks/gpu_sampling_bench.py
measures it). `KernelSettings.triton_sampling=False` keeps torch's path.

Seeds: a request with `sampling_seed` draws the token at output position p from random numbers
that are a function of (seed, p) alone (counter-based: Philox in the kernel, a hash on torch's
path), so seeded rows are drawn in the same batched pass as the others and a seeded request
gives the same tokens whatever it is batched with and however often it runs (given the same
logits: the same machine, kernels and settings). The two paths use different random numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from radixflow.constrained.batch_mask import fill_bitmask_rows, new_bitmask
from radixflow.host_copy import to_device_async
from radixflow.kernels.bitmask import BiasRowCache, apply_token_bitmask
from radixflow.kernels.settings import DEFAULT_KERNEL_SETTINGS, KernelSettings
from radixflow.runtime.scheduling.req import Req
from radixflow.runtime.sampling_params import TOP_K_ALL


@dataclass
class SampleResult:
    next_ids: torch.Tensor  # [B] int64, on the logits' device
    logprobs: Optional[torch.Tensor] = None  # [B, V] float32 raw log-softmax, when any req asked
    chosen_logprobs: Optional[torch.Tensor] = None  # [B]


def _row_tensor(values: list, dtype, device) -> torch.Tensor:
    return to_device_async(torch.tensor(values, dtype=dtype), device)


def apply_penalties(logits: torch.Tensor, reqs: list) -> None:
    rows = [
        i
        for i, r in enumerate(reqs)
        if r.sampling.frequency_penalty or r.sampling.presence_penalty or r.sampling.repetition_penalty != 1.0
    ]
    if not rows:
        return
    dev = logits.device
    sub = [reqs[i] for i in rows]
    vocab = logits.shape[1]
    counts = torch.stack([_counts(r, vocab, dev) for r in sub]).float()
    idx = _row_tensor(rows, torch.int64, dev)
    part = logits[idx]
    freq = _row_tensor([r.sampling.frequency_penalty for r in sub], torch.float32, dev).unsqueeze(1)
    pres = _row_tensor([r.sampling.presence_penalty for r in sub], torch.float32, dev).unsqueeze(1)
    part = part - freq * counts - pres * (counts > 0).float()
    rep = _row_tensor([r.sampling.repetition_penalty for r in sub], torch.float32, dev).unsqueeze(1)
    seen = counts > 0
    masked = [i for i, r in enumerate(sub) if r.prompt_mask is not None]  # rows with a repetition penalty
    if masked:
        seen[masked] |= torch.stack([sub[i].prompt_mask for i in masked])
    penalized = torch.where(part > 0, part / rep, part * rep)
    part = torch.where(seen, penalized, part)
    logits[idx] = part


def _counts(r: Req, vocab: int, device) -> torch.Tensor:
    """The request's output token counts, brought up to output_ids: the penalties count every output token, however
    it came. Outputs appended unsampled (a grammar's jump) are added; a cut (Scheduler.rewind) drops the counts,
    which are then made again from all of output_ids."""
    if r.output_counts is None or r.counted > len(r.output_ids):
        r.output_counts, r.counted = torch.zeros(vocab, dtype=torch.int32, device=device), 0
    if r.counted < len(r.output_ids):
        ids = torch.tensor(r.output_ids[r.counted :], dtype=torch.int64, device=device)
        r.output_counts.scatter_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))
        r.counted = len(r.output_ids)
    return r.output_counts


def record_sampled(reqs: list, next_ids: list) -> None:
    """Keep penalty counts current after a step (called before each token joins output_ids)."""
    for r, t in zip(reqs, next_ids):
        if r.output_counts is not None and r.counted == len(r.output_ids):
            r.output_counts[t] += 1
            r.counted += 1


def mask_stop_tokens(logits: torch.Tensor, reqs: list, eos_ids: set) -> None:
    """min_new_tokens: EOS and stop ids cannot be sampled before it is reached."""
    for i, r in enumerate(reqs):
        if r.segment_len < r.sampling.min_new_tokens:
            banned = list(eos_ids | set(r.sampling.stop_token_ids or []))
            logits[i, banned] = float("-inf")


def let_grammars_end(logits: torch.Tensor, reqs: list, eos_ids: set) -> None:
    """min_new_tokens against a grammar: where the grammar allows nothing but its end (EOS, which min_new_tokens
    banned), no token would be left to sample: the grammar wins, and EOS is allowed again. Only rows under both
    are looked at (a read of their mask rows), so other batches pay nothing."""
    rows = [i for i, r in enumerate(reqs) if r.grammar is not None and r.segment_len < r.sampling.min_new_tokens]
    if not rows:
        return
    stuck = torch.isneginf(logits[rows]).all(dim=1).tolist()
    for i, none_left in zip(rows, stuck):
        if none_left:
            logits[i, sorted(eos_ids)] = 0.0


SMALL_MASK_BATCH = 2  # up to this many constrained rows on CPU: add cached bias rows
_BIAS_ROWS = BiasRowCache()


def apply_grammar_masks(logits: torch.Tensor, reqs: list) -> None:
    rows = [i for i, r in enumerate(reqs) if r.grammar is not None]
    if not rows:
        return
    small = not logits.is_cuda and len(rows) <= SMALL_MASK_BATCH and logits.dtype == torch.float32
    if small and all(reqs[i].grammar.masks_cached for i in rows):  # masks that live as long as their grammar
        for i in rows:  # one add beats a table lookup over the whole vocabulary at this size
            logits[i].add_(_BIAS_ROWS.get(reqs[i].grammar.current_mask(), logits.shape[1]))
        return
    free = [i for i, r in enumerate(reqs) if r.grammar is None]
    bitmask = new_bitmask(len(reqs), (logits.shape[1] + 31) // 32, pinned=logits.is_cuda, free=free)
    fill_bitmask_rows(bitmask, [(i, reqs[i].grammar) for i in rows])  # the grammar rows
    apply_token_bitmask(logits, bitmask.to(logits.device, non_blocking=True))


def apply_logit_bias(logits: torch.Tensor, reqs: list) -> None:
    for i, r in enumerate(reqs):
        if r.sampling.logit_bias:
            ids = [int(k) for k in r.sampling.logit_bias]
            vals = [float(v) for v in r.sampling.logit_bias.values()]
            logits[i, ids] += _row_tensor(vals, torch.float32, logits.device)


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """logits.argmax(dim=-1); on CUDA through a two-pass Triton kernel (torch's takes one block a row)."""
    if logits.is_cuda:
        from radixflow.kernels.argmax import argmax_rows

        return argmax_rows(logits)
    return logits.argmax(dim=-1)


def sample_from(logits: torch.Tensor, reqs: list, batch_invariant: bool = False, triton: bool = True) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p, then one draw per row; greedy rows take argmax.
    `batch_invariant` (deterministic inference): torch's path works on one row at a time, so a
    seeded request draws from the same bits in any batch: torch's sum and cumsum over a vocabulary
    row gave other bits at other row counts on CUDA (the Triton kernel works on each row alone
    anyway). `triton`: the Triton kernel on CUDA."""
    greedy = [r.sampling.is_greedy for r in reqs]
    if all(greedy):
        return greedy_ids(logits)
    dev = logits.device
    temps = [max(r.sampling.temperature, 1e-6) for r in reqs]
    top_k = [r.sampling.top_k if r.sampling.top_k > 0 else TOP_K_ALL for r in reqs]
    top_p = [r.sampling.top_p for r in reqs]
    min_p = [r.sampling.min_p for r in reqs]
    keys = draw_keys(reqs)
    if logits.is_cuda and triton:
        from radixflow.kernels.sampling import sample_rows

        sampled = sample_rows(logits, temps, top_k, top_p, min_p, keys=keys)
    elif batch_invariant:
        u = draw_uniforms(keys, dev)  # one copy for the batch, sliced per row
        rows = [_sample_torch(logits[i : i + 1], temps[i : i + 1], top_k[i : i + 1], top_p[i : i + 1],
                              min_p[i : i + 1], u[i : i + 1]) for i in range(len(reqs))]
        sampled = torch.cat(rows)
    else:
        sampled = _sample_torch(logits, temps, top_k, top_p, min_p, draw_uniforms(keys, dev))
    if not any(greedy):
        return sampled
    return torch.where(_row_tensor(greedy, torch.bool, dev), greedy_ids(logits), sampled)


def draw_keys(reqs: list) -> list:
    """Per row: (seed, output position of the token drawn) for a sampled request with a seed,
    else None. The seed is folded into [0, 2**63); the scheduler has counted the token being
    sampled into kv_len (overlapped passes too, whose previous token may not be on the host)."""
    return [
        None if r.sampling.sampling_seed is None or r.sampling.is_greedy
        else (r.sampling.sampling_seed % 2**63, r.kv_len - len(r.origin_input_ids))
        for r in reqs
    ]


def _sample_torch(logits: torch.Tensor, temps: list, top_k: list, top_p: list, min_p: list,
                  u: torch.Tensor) -> torch.Tensor:
    """torch's path: softmax, top-k / top-p by sorting (when any row truncates), min-p, one draw
    per row from its uniform in `u` ([B], on the logits' device)."""
    dev = logits.device
    probs = torch.softmax(logits / _row_tensor(temps, torch.float32, dev).unsqueeze(1), dim=-1)
    if any(k < logits.shape[1] for k in top_k) or any(p < 1.0 for p in top_p):
        probs = _top_k_top_p(probs, top_k, top_p)
    if any(m > 0 for m in min_p):
        mp = _row_tensor(min_p, torch.float32, dev).unsqueeze(1)
        probs = probs.masked_fill(probs < mp * probs.max(dim=-1, keepdim=True).values, 0.0)
    return _draw(probs, u, logits.argmax(dim=-1, keepdim=True))


def _top_k_top_p(probs: torch.Tensor, top_k: list, top_p: list) -> torch.Tensor:
    dev = probs.device
    sorted_p, order = probs.sort(dim=-1, descending=True)
    ranks = torch.arange(probs.shape[1], device=dev).unsqueeze(0)
    k = _row_tensor(top_k, torch.int64, dev).clamp(max=probs.shape[1]).unsqueeze(1)
    p = _row_tensor(top_p, torch.float32, dev).unsqueeze(1)
    cum_before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly above this token
    drop = (ranks >= k) | (cum_before > p)
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(1, order, sorted_p)


def _draw(probs: torch.Tensor, u: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """One draw per row by inverse CDF, from its uniform in u [B] (unnormalized probs >= 0). A row
    with no mass (every token banned: softmax gives NaN; NaN logits) takes `top`, its logits'
    argmax [B, 1], as the Triton kernel does, so the id stays inside the vocabulary."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    x = u.unsqueeze(1) * total
    x = torch.minimum(x, torch.nextafter(total, torch.zeros_like(total)))  # x < total: a token is found
    idx = torch.searchsorted(cdf, x, right=True).clamp_(max=probs.shape[1] - 1)  # the first token whose cdf passes x
    # p == 0 at idx only if the cumsum was not monotone (a parallel scan on CUDA can round so)
    drawn = (total > 0) & (probs.gather(1, idx) > 0)
    return torch.where(drawn, idx, top).squeeze(1)


def draw_uniforms(keys: list, device) -> torch.Tensor:
    """`row_uniforms(keys)` on `device`, in one copy."""
    return to_device_async(row_uniforms(keys), device)


def row_uniforms(keys: list) -> torch.Tensor:
    """float32 [B] in [0, 1) on the host: keyed rows from `keyed_uniforms`, the others from torch's generator."""
    u = torch.rand(len(keys))
    rows = [i for i, k in enumerate(keys) if k is not None]
    if rows:
        seeds, positions = torch.tensor([keys[i] for i in rows], dtype=torch.int64).unbind(1)
        u[rows] = keyed_uniforms(seeds, positions)
    return u


_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32) held in int64, in halves so that nothing overflows."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche (murmur3's finalizer)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def keyed_uniforms(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """A uniform in [0, 1) (24 bits) per (seed in [0, 2**63), position in [0, 2**32)), a
    function of the pair alone: the torch path's counter-based random numbers."""
    h = _mix32((positions & _M32) ^ 0x9E3779B9)
    h = _mix32(h ^ (seeds & _M32))
    h = _mix32(h ^ ((seeds >> 32) & _M32))
    return (h >> 8).to(torch.float32) * 2.0**-24


def sample(logits: torch.Tensor, reqs: list, eos_ids: set,
           settings: KernelSettings = DEFAULT_KERNEL_SETTINGS) -> SampleResult:
    """logits: [B, V] float32, modified in place. `settings`: batch_invariant and triton_sampling (see
    `sample_from`)."""
    want_lp = any(r.logprob.return_logprob for r in reqs)
    raw_lp = torch.log_softmax(logits, dim=-1) if want_lp else None
    apply_penalties(logits, reqs)
    mask_stop_tokens(logits, reqs, eos_ids)
    apply_grammar_masks(logits, reqs)
    let_grammars_end(logits, reqs, eos_ids)
    apply_logit_bias(logits, reqs)
    next_ids = sample_from(logits, reqs, settings.batch_invariant, settings.triton_sampling)
    chosen = raw_lp.gather(1, next_ids.unsqueeze(1)).squeeze(1) if want_lp else None
    return SampleResult(next_ids=next_ids, logprobs=raw_lp, chosen_logprobs=chosen)
