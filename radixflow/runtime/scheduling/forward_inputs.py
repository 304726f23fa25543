"""The inputs of one forward pass, built from the requests in it: token ids, positions,
KV slots and which rows need logits, packed into one host-to-device copy."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from radixflow.host_copy import to_device_async
from radixflow.runtime.execution.forward_batch import ForwardBatch
from radixflow.runtime.scheduling.kv_manager import KVManager
from radixflow.runtime.scheduling.req import Req


def logit_rows_for(req: Req, n: int, start: int) -> range:
    """Rows of the pass whose logits this chunk needs (its rows begin at `start`): with input
    logprobs, those from first_logit_pos(req) to the chunk's end; else the last, for sampling,
    if the prompt ends here. A select's scoring request recomputes part of its prompt but
    needs the logits of its choice tokens only."""
    if req.needs_input_logprobs:
        return range(start + first_logit_pos(req) - req.kv_len, start + n)
    done = req.kv_len + n >= req.seq_len
    return range(start + n - 1, start + n) if done else range(0)


def first_logit_pos(req: Req) -> int:
    """The first prompt position of this chunk whose logits input logprobs use: the one just
    before the next token whose logprob is due (its logits predict that token), but not before
    the chunk's first position (req.kv_len)."""
    return max(req.kv_len, req.input_logprob_next - 1)


def concat_ranges(starts: list[int], lens: list[int]) -> torch.Tensor:
    """arange(starts[i], starts[i] + lens[i]) for every i, one after another (int64), built without a
    loop over the requests: a torch.arange each and their cat cost ~10 us a request."""
    lens_a = np.asarray(lens, dtype=np.int64)
    before = np.cumsum(lens_a) - lens_a  # where each range starts in the result
    out = np.repeat(np.asarray(starts, dtype=np.int64) - before, lens_a) + np.arange(int(lens_a.sum()), dtype=np.int64)
    return torch.from_numpy(out)


def build_forward_batch(device: torch.device, mode, ids, positions, locs, batch, prefix, ext, rows) -> ForwardBatch:
    """`ids`: a list, or a tensor already on the device (overlapped decode); the rest host-side."""
    seq = [p + e for p, e in zip(prefix, ext)]
    flat_rows = list(itertools.chain.from_iterable(rows)) or [0]
    pool_rows = [r.req_pool_idx for r, _ in batch]
    host_ids = ids if isinstance(ids, list) else []
    lists = [host_ids, pool_rows, seq, prefix, ext, flat_rows]
    sizes = [len(x) for x in lists] + [positions.numel(), locs.numel()]
    # one asynchronous host-to-device copy for all of the pass's index tensors, each 16-byte aligned in it (an
    # even number of int64s before it): Triton compiles a kernel variant per alignment of its pointer arguments,
    # so unaligned parts made one per parity of the pass's token and request counts, some first met mid-run
    head: list = []
    for x in lists:  # one copy of each list (the token ids are thousands in an extend pass)
        head += x
        if len(x) % 2:
            head.append(0)
    pad = torch.zeros(positions.numel() % 2, dtype=torch.int64)
    packed = to_device_async(torch.cat([torch.tensor(head, dtype=torch.int64), positions.to(torch.int64), pad,
                                        locs.to(torch.int64)]), device)  # fmt: skip
    parts = torch.split(packed, [n + n % 2 for n in sizes[:-1]] + sizes[-1:])
    ids_t, rows_t, seq_t, pre_t, ext_t, logit_t, pos_t, loc_t = (part[:n] for part, n in zip(parts, sizes))
    ids_t = ids_t if isinstance(ids, list) else ids
    return ForwardBatch(
        mode=mode, input_ids=ids_t, positions=pos_t, out_cache_loc=loc_t, req_pool_indices=rows_t,
        seq_lens=seq_t, prefix_lens=pre_t, extend_lens=ext_t, logits_indices=logit_t,
        seq_lens_list=seq, prefix_lens_list=prefix, extend_lens_list=ext,
    )  # fmt: skip


def pending_tokens(kv: KVManager, reqs: list[Req], ext: list[int]):
    """Inputs of a continuation pass where some requests hold several pending tokens."""
    locs, ids = [], []
    for req, n in zip(reqs, ext):
        slots = kv.alloc(req, n)
        assert slots is not None, "decode room was reserved"
        locs.append(slots)
        ids.extend(req.pending_ids())
    pos = concat_ranges([r.kv_len for r in reqs], ext)
    return ids, pos, torch.cat(locs), [[e - 1] for e in itertools.accumulate(ext)]
