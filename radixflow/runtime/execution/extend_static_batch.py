"""Extend passes padded to fixed shapes, so that a CUDA graph can replay them (extend_graph_runner.py).

A graph reads fixed buffers of fixed shapes. An extend pass of T new tokens over B requests
runs in a bucket of Tp >= T token rows and Rp request rows:

- the request rows after the pass's B are empty (no new tokens, nothing to attend): the
  attention kernel's programs for them exit at once;
- the Tp - T padding tokens form one more request in row Rp, past the bucket's Rp rows (so a
  pass of Rp requests still fits): the *pad request*, no cached prefix, its K/V written to the
  scratch slot 0, attending over the first Tp - T slots of whatever req_to_token row its index
  holds; its output rows are never read. Without padding it is one more empty row;
- the graph computes logits for Rp hidden rows: the pass's `logits_indices`, then row 0.

Every other layer works row by row (linear layers, norms, rotary, the MLP), so no real row
sees the padding: its outputs and K/V are the unpadded pass's (up to the kernels a matmul
picks for the padded row count). Index buffers are only partly rewritten: the stale entries
are token ids, positions and req_to_token rows of earlier passes, always valid indices.
"""

from __future__ import annotations

import bisect
import itertools
from typing import NamedTuple, Optional

import torch

from radixflow.host_copy import to_device_async
from radixflow.runtime.execution.forward_batch import ForwardBatch, ForwardMode

MIN_TOKEN_BUCKET = 16


class ExtendBucket(NamedTuple):  # a tuple, not a dataclass: pick_bucket's bisections compare in C
    tokens: int  # token rows, padding included
    reqs: int  # request rows (empty ones included; the pad request's row comes after them); also the most logits rows


def token_buckets(max_tokens: int) -> list[int]:
    """16, 24, 32, 48, 64, 96, ...: powers of two and the midpoints between them, so that padding
    is at most a third of a pass; then max_tokens itself."""
    sizes, p = [], MIN_TOKEN_BUCKET
    while p < max_tokens:
        sizes += [s for s in (p, p + p // 2) if s < max_tokens]
        p *= 2
    return sizes + [max_tokens]


def request_buckets(max_reqs: int) -> list[int]:
    """1, 2, 4, ... below max_reqs, then max_reqs."""
    sizes = [1 << i for i in range(max_reqs.bit_length()) if 1 << i < max_reqs]
    return sizes + [max_reqs]


def extend_buckets(max_tokens: int, max_reqs: int) -> list[ExtendBucket]:
    """Every (token, request) bucket pair a pass can need, sorted: a pass has at least one new token
    per request, so a token bucket takes request buckets up to the first that holds as many rows."""
    reqs = request_buckets(max_reqs)
    out = []
    for t in token_buckets(max_tokens):
        fit = next((r for r in reqs if r >= t), reqs[-1])
        out += [ExtendBucket(t, r) for r in reqs if r <= fit]
    return sorted(out)


def pick_bucket(buckets: list[ExtendBucket], num_tokens: int, num_reqs: int, num_logits: int) -> Optional[ExtendBucket]:
    """The smallest bucket (fewest token rows, then request rows) that holds the pass, else None. The pad
    request has its own row past the bucket's, so a bucket of R request rows holds passes of R requests.
    `buckets` is sorted (extend_buckets): bisections, not a scan, since every extend pass asks."""
    need = max(num_reqs, num_logits)
    i = bisect.bisect_left(buckets, (num_tokens, need))
    # i holds the pass, or is a larger token size's first bucket (one request row): move to that size's first bucket
    # with enough request rows, or on to the next size's
    while i < len(buckets) and buckets[i].reqs < need:
        i = bisect.bisect_left(buckets, (buckets[i].tokens, need), i)
    return buckets[i] if i < len(buckets) else None


class StaticExtendInputs:
    """The fixed buffers every extend graph reads, sized for the largest bucket; a bucket's graph
    reads their first `tokens` token rows, `reqs` + 1 request rows (the pad request's last) and `reqs`
    logits rows."""

    def __init__(self, buckets: list[ExtendBucket], device):
        self.device = torch.device(device)
        t, r = max(b.tokens for b in buckets), max(b.reqs for b in buckets)
        i64 = {"dtype": torch.int64, "device": device}
        self.input_ids, self.positions, self.out_cache_loc = (torch.zeros(t, **i64) for _ in range(3))
        # per request row: rows of req_to_token, KV lengths, first q row
        self.req_pool_indices, self.prefix_lens, self.extend_lens, self.seq_lens, self.q_start = (
            torch.zeros(r + 1, **i64) for _ in range(5))
        self.logits_indices = torch.zeros(r, **i64)

    def batch(self, b: ExtendBucket, lists: Optional[tuple[list, list, list]] = None) -> ForwardBatch:
        """The bucket's static batch. `lists`: host (prefix, extend, seq) lengths, which only a backend
        running without a graph reads (AttentionBackend.init_static_extend); None: empty."""
        prefix, ext, seq = lists if lists is not None else ([], [], [])
        r = b.reqs + 1  # the pad request's row
        return ForwardBatch(
            mode=ForwardMode.EXTEND, input_ids=self.input_ids[: b.tokens], positions=self.positions[: b.tokens],
            out_cache_loc=self.out_cache_loc[: b.tokens], req_pool_indices=self.req_pool_indices[:r],
            seq_lens=self.seq_lens[:r], prefix_lens=self.prefix_lens[:r],
            extend_lens=self.extend_lens[:r], logits_indices=self.logits_indices[: b.reqs],
            seq_lens_list=seq, prefix_lens_list=prefix, extend_lens_list=ext,
        )  # fmt: skip

    def fill(self, fb: Optional[ForwardBatch], b: ExtendBucket) -> tuple[list, list, list]:
        """Write `fb` (None: a pass of padding only, for capture) into the buffers, padded to `b`, with
        one host-to-device copy and one multi-tensor copy; returns the padded host lengths."""
        t = fb.num_tokens if fb is not None else 0
        n = fb.logits_indices.numel() if fb is not None else 0
        pad = b.tokens - t
        prefix, ext = (list(fb.prefix_lens_list), list(fb.extend_lens_list)) if fb is not None else ([], [])
        empty = b.reqs - len(ext)
        prefix, ext = prefix + [0] * (empty + 1), ext + [0] * empty + [pad]  # empty rows, then the pad request
        seq = [p + e for p, e in zip(prefix, ext)]
        q_start = list(itertools.accumulate(ext[:-1], initial=0))
        r = b.reqs + 1
        # lengths, first rows, then zeros for the padding's KV slots (the scratch slot) and logits rows
        host = torch.tensor(prefix + ext + seq + q_start + [0] * (pad + b.reqs - n), dtype=torch.int64)
        staged = torch.split(to_device_async(host, self.device), [r] * 4 + [pad, b.reqs - n])
        dst = [self.prefix_lens[:r], self.extend_lens[:r], self.seq_lens[:r], self.q_start[:r],
               self.out_cache_loc[t : b.tokens], self.logits_indices[n : b.reqs]]  # fmt: skip
        src = list(staged)
        if fb is not None:
            bs = fb.batch_size
            dst += [self.input_ids[:t], self.positions[:t], self.out_cache_loc[:t], self.req_pool_indices[:bs],
                    self.logits_indices[:n]]  # fmt: skip
            src += [fb.input_ids, fb.positions, fb.out_cache_loc, fb.req_pool_indices, fb.logits_indices]
        keep = [i for i, d in enumerate(dst) if d.numel()]
        torch._foreach_copy_([dst[i] for i in keep], [src[i] for i in keep])
        return prefix, ext, seq
