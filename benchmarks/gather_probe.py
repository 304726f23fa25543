"""The read rate of decode attention's gather alone, no attention: what the KV pool's layout allows (one GPU).

Used by fp8_attn_bench.py, per case: a Triton kernel with decode attention's grid (a program per request and
KV head, or KV heads first: `hf`) reads each of its tokens' K and V rows through req_to_token, in blocks, and
only adds them up as int32 words (a pool row of 128 dims is 128 bytes in FP8, 256 in bf16): how fast the
GPU gathers rows of that size from randomly permuted slots, against which the attention kernels' TB/s can
be read. Timed per call in a CUDA graph, as the kernels are.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixflow.kernels.gemv import time_graph_us


@triton.jit
def _gather_sum(K, V, ReqToToken, ReqIdx, SeqLens, Out, stride_t, stride_h, stride_r2t,
                WORDS: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_FIRST: tl.constexpr):
    b = tl.program_id(1 if HEAD_FIRST else 0)
    kvh = tl.program_id(0 if HEAD_FIRST else 1)
    seq_len = tl.load(SeqLens + b).to(tl.int32)
    row = tl.load(ReqIdx + b).to(tl.int64)
    offs_w = tl.arange(0, WORDS)
    acc = tl.zeros([BLOCK_N, WORDS], tl.int32)
    for n0 in range(0, seq_len, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask = offs_n < seq_len
        slot = tl.load(ReqToToken + row * stride_r2t + offs_n, mask=mask, other=0).to(tl.int64)
        at = slot[:, None] * stride_t + kvh * stride_h + offs_w[None, :]
        acc += tl.load(K + at, mask=mask[:, None], other=0) + tl.load(V + at, mask=mask[:, None], other=0)
    tl.store(Out + (b * tl.num_programs(0 if HEAD_FIRST else 1) + kvh) * WORDS + offs_w, tl.sum(acc, axis=0))


def gather_us(x: dict, pool: tuple, block_n: int, head_first: bool) -> tuple[float, int]:
    """(us a call, bytes read) of the gather over bench inputs `x` (gpu_attn_bench.make_inputs) from `pool` (K, V)."""
    k, v = (t.view(torch.int32) for t in pool)
    words, hkv, bs = k.shape[2], k.shape[1], len(x["lens"])
    out = torch.empty(bs * hkv * words, dtype=torch.int32, device=k.device)
    grid = (hkv, bs) if head_first else (bs, hkv)

    def run(i: int):
        _gather_sum[grid](k, v, x["table"], x["idx"][i % x["copies"]], x["lens"], out, k.stride(0), k.stride(1),
                          x["table"].stride(0), WORDS=words, BLOCK_N=block_n, HEAD_FIRST=head_first, num_warps=4,
                          num_stages=3)

    nbytes = int(x["lens"].sum()) * hkv * words * 4 * 2
    return time_graph_us(run, max(x["copies"], 4)), nbytes


def probe_case(x: dict, fp8_pool: tuple) -> dict:
    """{label: {"us", "tbs"}} for the bf16 pool in 64-token blocks and the FP8 pool in 64- and 128-token ones,
    requests or KV heads first in the grid."""
    res = {}
    for name, pool, block_n in (("bf16", (x["k"], x["v"]), 64), ("fp8", fp8_pool, 64), ("fp8", fp8_pool, 128)):
        for head_first in (False, True):
            us, nbytes = gather_us(x, pool, block_n, head_first)
            res[f"{name}_n{block_n}{'_hf' if head_first else ''}"] = {"us": us, "tbs": nbytes / us / 1e6}
    return res
