"""Temperature / top-k / top-p / min-p sampling without sorting the vocabulary (CUDA).

torch's path (runtime/scheduling/sampler.py) sorts every row of probabilities for top-k / top-p, which at
a 128k vocabulary costs several times the rest of sampling together. Here a row is cut into chunks of BLOCK tokens
and sampled by rejection in two kernels:

1. `_chunk_stats`, one program per (row, chunk): the chunk's max logit, its argmax and
   sum exp((logit - chunk max) / temperature). Every chunk of every row at once, so this
   streams the logits at memory speed even for one row.
2. `_draw`, one program per row: from the chunks' figures, the row's max m and
   Z = sum exp(s), s = (logit - m) / temperature, and each chunk's mass; then
   a. draw x from the candidates (at first every token with p >= min_p * p_max) by inverse
      CDF: pick the chunk from the chunk masses, then scan that chunk alone;
   b. x is in the allowed set iff fewer than top_k tokens have a larger s and their mass is
      at most top_p * Z (the sort-based rule: "drop a token once the mass above it exceeds
      top_p"). Only chunks whose max is above x can hold such tokens, so only those are
      scanned (for a peaked distribution, a few). Accept, or reject x and every token not
      above it (they fail the same test): the candidates shrink to {s > s_x}, whose mass per
      chunk that scan just summed; go to a.

A draw from a superset, kept only when it lands in the allowed set, is a draw from the allowed
set renormalised, so this samples exactly what the sort-based path samples (ties between
equal logits aside). The top token always passes, so each row ends; after MAX_ROUNDS rejected
draws (vanishingly unlikely: each one removes the drawn token and all below it) the row takes
its argmax. Random numbers: Philox (`tl.rand`), one per round, keyed per row by a seed and a
counter. A seeded row passes its request's seed and its output position, so its draws depend
on nothing else in the batch; an unseeded row passes a seed drawn from torch's CPU generator
per call and its row index, so `torch.manual_seed` makes runs repeatable. The host never waits
for the GPU. Reference: runtime/scheduling/sampler.py's torch path.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from radixflow.host_copy import to_device_async

BLOCK_V = 4096
MAX_ROUNDS = 64


@triton.jit
def _scaled(Row, start, offs, V, m, inv_t):
    """s = (logit - m) / temperature of one chunk; -inf outside the row."""
    x = tl.load(Row + start + offs, mask=start + offs < V, other=float("-inf"))
    return (x - m) * inv_t


@triton.jit
def _chunk_stats(Logits, InvTemp, ChunkMax, ChunkSum, ChunkTop, stride, V, num_chunks, BLOCK: tl.constexpr):
    row, chunk = tl.program_id(0), tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(Logits + row.to(tl.int64) * stride + offs, mask=offs < V, other=float("-inf"))
    m = tl.max(x, axis=0)
    e = tl.where(x > float("-inf"), tl.exp((x - m) * tl.load(InvTemp + row)), 0.0)  # 0 for a chunk of -inf
    at = row * num_chunks + chunk
    tl.store(ChunkMax + at, m)
    tl.store(ChunkSum + at, tl.sum(e, axis=0))
    tl.store(ChunkTop + at, (chunk * BLOCK + tl.argmax(x, axis=0)).to(tl.float32))  # exact below 2**24


@triton.jit
def _draw(Logits, InvTemp, TopP, LogMinP, TopK, Seeds, Counters, ChunkMax, ChunkSum, ChunkTop, Out, Rounds, stride, V,
          num_chunks, BLOCK: tl.constexpr, CHUNKS: tl.constexpr, MAX_ROUNDS: tl.constexpr, STORE_ROUNDS: tl.constexpr):
    row = tl.program_id(0)
    base = Logits + row.to(tl.int64) * stride
    offs = tl.arange(0, BLOCK)
    chunks = tl.arange(0, CHUNKS)
    inv_t, top_p, lmin = tl.load(InvTemp + row), tl.load(TopP + row), tl.load(LogMinP + row)
    k = tl.load(TopK + row).to(tl.int32)
    seed, counter = tl.load(Seeds + row), tl.load(Counters + row) * MAX_ROUNDS
    cmax = tl.load(ChunkMax + row * num_chunks + chunks, mask=chunks < num_chunks, other=float("-inf"))
    m = tl.max(cmax, axis=0)
    top = tl.load(ChunkTop + row * num_chunks + tl.argmax(cmax, axis=0)).to(tl.int32)  # the lowest index among ties
    cs = (cmax - m) * inv_t  # each chunk's largest s
    csum = tl.load(ChunkSum + row * num_chunks + chunks, mask=chunks < num_chunks, other=0.0)
    weight = tl.where(cs > float("-inf"), csum * tl.exp(cs), 0.0)
    z = tl.sum(weight, axis=0)
    cand = weight  # per chunk, the mass of the candidates: tokens with s > low and s >= lmin
    if lmin > float("-inf"):  # min-p: only chunks reaching the cut hold candidates
        cand = tl.zeros([CHUNKS], tl.float32)
        for c0 in range(0, num_chunks):
            if (tl.load(ChunkMax + row * num_chunks + c0) - m) * inv_t >= lmin:
                s = _scaled(base, c0 * BLOCK, offs, V, m, inv_t)
                cand = tl.where(chunks == c0, tl.sum(tl.where(s >= lmin, tl.exp(s), 0.0), axis=0), cand)
    low = float("-inf")
    result = top
    done = 0
    rnd = 0
    while (done == 0) & (rnd < MAX_ROUNDS):
        cum = tl.cumsum(cand, axis=0)
        u = tl.rand(seed, counter + rnd) * tl.sum(cand, axis=0)
        c = tl.min(tl.where((cum > u) & (cand > 0), chunks, CHUNKS), axis=0)  # the chunk the draw lands in
        chosen = top  # u rounded past the candidates' sum (~1e-7): the top token
        if c < CHUNKS:
            s = _scaled(base, c * BLOCK, offs, V, m, inv_t)
            e = tl.where((s > low) & (s >= lmin), tl.exp(s), 0.0)
            before = tl.sum(tl.where(chunks < c, cand, 0.0), axis=0)
            hit = (tl.cumsum(e, axis=0) + before > u) & (e > 0)
            first = tl.min(tl.where(hit, offs, BLOCK), axis=0)
            first = tl.where(first < BLOCK, first, tl.max(tl.where(e > 0, offs, -1), axis=0))  # rounding: the last
            chosen = tl.where(first >= 0, c * BLOCK + first, top)
        s_x = (tl.load(base + chosen) - m) * inv_t
        count = 0
        above = tl.zeros([CHUNKS], tl.float32)  # per chunk, the mass of the tokens above x
        for c2 in range(0, num_chunks):  # allowed? the tokens (and their mass) above it
            if (tl.load(ChunkMax + row * num_chunks + c2) - m) * inv_t > s_x:
                s = _scaled(base, c2 * BLOCK, offs, V, m, inv_t)
                gt = s > s_x
                count += tl.sum(gt.to(tl.int32), axis=0)
                above = tl.where(chunks == c2, tl.sum(tl.where(gt, tl.exp(s), 0.0), axis=0), above)
        ok = (count < k) & ((top_p >= 1.0) | (tl.sum(above, axis=0) <= top_p * z))  # no rounding at top_p 1
        result = tl.where(ok, chosen, result)
        done = ok.to(tl.int32)
        low = s_x
        cand = above  # the candidates next round: {s > s_x}
        rnd += 1
    tl.store(Out + row, result.to(tl.int64))
    if STORE_ROUNDS:
        tl.store(Rounds + row, rnd)


def sample_rows(logits: torch.Tensor, temperature: list[float], top_k: list[int], top_p: list[float],
                min_p: list[float], block: int = BLOCK_V, rounds: torch.Tensor | None = None,
                keys: list[tuple[int, int] | None] | None = None) -> torch.Tensor:
    """One token id per row of logits [B, V] (float32), each row with its own temperature (> 0),
    top_k (>= 1; >= V for all), top_p (0, 1] and min_p [0, 1) (host lists of B) -> int64 [B].
    `keys`: per row, None or (seed in [0, 2**63), draw index >= 0): a keyed row's random numbers
    are a function of its key alone. The per-row parameters are prepared on the host and reach
    the GPU in one copy, with no kernel launched for them. `rounds` (int32 [B]), if given,
    receives each row's number of draws."""
    b, v = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1 and v < 2**24  # indices exact in float32
    out = torch.empty(b, dtype=torch.int64, device=logits.device)
    if b == 0:
        return out
    params, seeds = _row_params(temperature, top_k, top_p, min_p, keys, v, logits.device)
    block = min(block, triton.next_power_of_2(v))
    num_chunks = triton.cdiv(v, block)
    chunk_stats = torch.empty((3, b, num_chunks), dtype=torch.float32, device=logits.device)  # max, sum, argmax
    _chunk_stats[(b, num_chunks)](logits, params[0], *chunk_stats, logits.stride(0), v, num_chunks,
                                  BLOCK=block, num_warps=4)
    _draw[(b,)](
        logits, *params, *seeds, *chunk_stats, out, out if rounds is None else rounds,
        logits.stride(0), v, num_chunks,
        BLOCK=block, CHUNKS=triton.next_power_of_2(num_chunks), MAX_ROUNDS=MAX_ROUNDS, STORE_ROUNDS=rounds is not None,
        num_warps=8,
    )
    return out


def _row_params(temperature: list[float], top_k: list[int], top_p: list[float], min_p: list[float],
                keys: list[tuple[int, int] | None] | None, v: int,
                device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-row parameters as float32 [4, B] and the Philox keys as int64 [2, B] (seed,
    counter), filled into one host buffer (pinned when bound for CUDA) so that they reach the
    GPU in one copy."""
    b = len(temperature)
    call_seed = int(torch.randint(0, 2**31 - 1, (1,)).item())  # CPU generator: no wait for the GPU
    keys = keys or [None] * b
    host = torch.empty(4 * b * 4 + 2 * b * 8, dtype=torch.uint8, pin_memory=torch.device(device).type == "cuda")
    floats, ints = host[: 16 * b].view(torch.float32).view(4, b), host[16 * b :].view(torch.int64).view(2, b)
    floats.copy_(torch.tensor([
        [1.0 / t for t in temperature],
        top_p,
        [math.log(p) if p > 0 else -math.inf for p in min_p],
        [min(k, v) for k in top_k],
    ], dtype=torch.float32))
    ints.copy_(torch.tensor([
        [call_seed if key is None else key[0] for key in keys],
        [i if key is None else key[1] for i, key in enumerate(keys)],
    ], dtype=torch.int64))
    dev = to_device_async(host, device)  # already pinned: pin_memory() returns it as is
    return dev[: 16 * b].view(torch.float32).view(4, b), dev[16 * b :].view(torch.int64).view(2, b)
