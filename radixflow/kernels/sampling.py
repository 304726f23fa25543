"""Temperature / top-k / top-p / min-p sampling without sorting the vocabulary (CUDA).

torch's path (runtime/sampler.py) sorts every row of probabilities for top-k / top-p, which at
a 128k vocabulary costs more than the rest of sampling together: 5.5 ms for 256 rows on an
H200 against 0.8 ms for greedy (BENCHMARKS.md). Here one program owns a row and draws by
rejection (1.7 ms there):

1. two passes find the row's max logit m and Z = sum exp(s), s = (logit - m) / temperature;
2. draw x from the candidates (at first every token with p >= min_p * p_max) by inverse CDF
   in index order: one pass, up to the block where the draw lands;
3. x is in the allowed set iff fewer than top_k tokens have a larger s and their mass is at
   most top_p * Z (the sort-based rule: "drop a token once the mass above it exceeds top_p"):
   one pass. Accept, or reject x and every token not above it (they fail the same test), so
   the candidates shrink to {s > s_x}, whose mass that pass already summed; go to 2.

A draw from a superset, kept only when it lands in the allowed set, is a draw from the allowed
set renormalised, so this samples exactly what the sort-based path samples (ties between
equal logits aside). The top token always passes, so each row ends; after MAX_ROUNDS rejected
draws (vanishingly unlikely: each one removes the drawn token and all below it) the row takes
its argmax. Random numbers: Philox (`tl.rand`) keyed by a seed drawn from torch's CPU
generator per call, so `torch.manual_seed` makes runs repeatable and the host never waits for
the GPU. Reference: runtime/sampler.py's torch path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixflow.host_copy import to_device_async

BLOCK_V = 4096
MAX_ROUNDS = 64


@triton.jit
def _scaled(Row, start, offs, V, m, inv_t):
    """s = (logit - m) / temperature of one block; -inf outside the row."""
    x = tl.load(Row + start + offs, mask=start + offs < V, other=float("-inf"))
    return (x - m) * inv_t


@triton.jit
def _sample_kernel(Logits, InvTemp, TopK, TopP, LogMinP, Out, Rounds, stride, V, seed,
                   BLOCK: tl.constexpr, MAX_ROUNDS: tl.constexpr):
    row = tl.program_id(0)
    base = Logits + row.to(tl.int64) * stride
    offs = tl.arange(0, BLOCK)
    inv_t, k, top_p, lmin = tl.load(InvTemp + row), tl.load(TopK + row), tl.load(TopP + row), tl.load(LogMinP + row)
    m = float("-inf")
    top = 0
    for start in range(0, V, BLOCK):
        x = tl.load(base + start + offs, mask=start + offs < V, other=float("-inf"))
        bm = tl.max(x, axis=0)
        top = tl.where(bm > m, start + tl.argmax(x, axis=0), top)
        m = tl.maximum(m, bm)
    z = 0.0
    mass = 0.0  # of the candidates: tokens with s > low and s >= lmin
    for start in range(0, V, BLOCK):
        s = _scaled(base, start, offs, V, m, inv_t)
        e = tl.exp(s)
        z += tl.sum(e, axis=0)
        mass += tl.sum(tl.where(s >= lmin, e, 0.0), axis=0)
    low = float("-inf")
    result = top
    done = 0
    rnd = 0
    while (done == 0) & (rnd < MAX_ROUNDS):
        u = tl.rand(seed, row * MAX_ROUNDS + rnd) * mass
        chosen = -1
        acc = 0.0
        start = 0
        while (chosen < 0) & (start < V):  # inverse CDF over the candidates, in index order
            s = _scaled(base, start, offs, V, m, inv_t)
            e = tl.where((s > low) & (s >= lmin), tl.exp(s), 0.0)
            total = tl.sum(e, axis=0)
            if acc + total > u:  # the draw lands in this block: scan it
                hit = (tl.cumsum(e, axis=0) + acc > u) & (e > 0)
                chosen = tl.min(tl.where(hit, start + offs, V), axis=0)
                chosen = tl.where(chosen < V, chosen, -1)
            acc += total
            start += BLOCK
        chosen = tl.where(chosen < 0, top, chosen)  # u * mass rounded past the candidates' sum: ~1e-7
        s_x = (tl.load(base + chosen) - m) * inv_t
        count = 0
        above = 0.0
        for start in range(0, V, BLOCK):  # allowed? the tokens (and their mass) above it
            s = _scaled(base, start, offs, V, m, inv_t)
            gt = s > s_x
            count += tl.sum(gt.to(tl.int32), axis=0)
            above += tl.sum(tl.where(gt, tl.exp(s), 0.0), axis=0)
        ok = (count < k) & (above <= top_p * z)
        result = tl.where(ok, chosen, result)
        done = ok.to(tl.int32)
        low = s_x
        mass = above  # the candidates' mass next round: {s > s_x}
        rnd += 1
    tl.store(Out + row, result.to(tl.int64))
    tl.store(Rounds + row, rnd)


def sample_rows(logits: torch.Tensor, temperature: list[float], top_k: list[int], top_p: list[float],
                min_p: list[float], block: int = BLOCK_V, rounds: torch.Tensor | None = None) -> torch.Tensor:
    """One token id per row of logits [B, V] (float32), each row with its own temperature (> 0),
    top_k (>= 1; >= V for all), top_p (0, 1] and min_p [0, 1) (host lists of B) -> int64 [B].
    The per-row parameters are prepared on the host and reach the GPU in two copies, with no
    kernel launched for them. `rounds` (int32 [B]), if given, receives each row's number of draws."""
    b, v = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1
    out = torch.empty(b, dtype=torch.int64, device=logits.device)
    rounds = torch.empty(b, dtype=torch.int32, device=logits.device) if rounds is None else rounds
    if b == 0:
        return out
    rows = torch.tensor([temperature, top_p, min_p], dtype=torch.float32)
    rows[0] = 1.0 / rows[0]
    rows[2] = torch.where(rows[2] > 0, torch.log(rows[2].clamp(min=1e-30)), float("-inf"))
    inv_t, top_p_t, log_min_p = to_device_async(rows, logits.device)
    k = to_device_async(torch.tensor([min(x, v) for x in top_k], dtype=torch.int32), logits.device)
    seed = int(torch.randint(0, 2**31 - 1, (1,)).item())  # CPU generator: no wait for the GPU
    _sample_kernel[(b,)](
        logits, inv_t, k, top_p_t, log_min_p, out, rounds,
        logits.stride(0), v, seed, BLOCK=min(block, triton.next_power_of_2(v)), MAX_ROUNDS=MAX_ROUNDS,
        num_warps=8,
    )
    return out
