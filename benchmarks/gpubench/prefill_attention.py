"""Section prefill_attention: the Triton extend kernel against torch's flash attention on prompt-only chunks.

A prompt-only chunk (no cached prefix) is what most of an offline workload's prefill is; there each
request's K and V are its own new tokens, so a packed variable-length kernel can read them straight
from the projections instead of through the paged pool. This section times, per chunk of Llama-3-8B
heads (32 query heads, 8 KV heads, d 128, bf16):

  triton         kernels/extend_attention.py through req_to_token (what the engine runs today)
  flash_varlen   torch's flash-attention forward over the packed chunk (aten._flash_attention_forward),
                 K/V with their 8 heads (grouped-query attention inside the kernel)
  flash_expanded the same with K/V repeated to 32 heads first (the copy counted), in case the first is refused
  cudnn_dense    (equal lengths only) torch's SDPA on its cuDNN backend over [B, H, L, D] views, K/V with 8
                 heads (enable_gqa); cudnn_dense_expanded with K/V repeated to 32 heads first

Cases: an offline-like chunk (prompts U[32, 1024] up to 8,192 tokens) and 4 x 2,048 (the prefill
benchmark's prompts). Every candidate is checked against the torch reference on the case's first
prompts (max abs error), then timed queued behind a sleeping kernel (host launch time left out, best
of 3 rounds); a candidate that raises records its error.
TFLOP/s counts causal attention as computed: 4 * Hq * D * sum(L (L + 1) / 2).
"""

from __future__ import annotations

import random

import torch

from gpubench.common import DEV, SZ, cuda_time

HQ, HKV, D = 32, 8, 128


def _case_lengths(name: str) -> list[int]:
    if name == "offline_chunk":
        rng, lens = random.Random(2024), []
        while sum(lens) < SZ["pa_tokens"]:
            lens.append(min(rng.randint(32, SZ["pa_max"]), SZ["pa_tokens"] - sum(lens)))
        return lens
    return [SZ["pa_tokens"] // 4] * 4


def _inputs(lens: list[int]) -> dict:
    """q, k, v packed request-major (bf16 on the GPU, float32 on the CPU), and the same K/V in a paged pool
    at a random permutation of its slots (a pool after churn)."""
    dtype = torch.bfloat16 if DEV == "cuda" else torch.float32
    t = sum(lens)
    q, k, v = (torch.randn(t, h, D, device=DEV).to(dtype) for h in (HQ, HKV, HKV))
    slots = torch.randperm(t, device=DEV)
    k_buf, v_buf = torch.empty_like(k), torch.empty_like(v)
    k_buf[slots], v_buf[slots] = k, v
    table = torch.zeros(len(lens), max(lens), dtype=torch.int32, device=DEV)
    starts = [sum(lens[:i]) for i in range(len(lens))]
    for b, (s, n) in enumerate(zip(starts, lens)):
        table[b, :n] = slots[s : s + n].to(torch.int32)
    as_t = lambda xs: torch.tensor(xs, device=DEV)  # noqa: E731
    cu = as_t(starts + [t]).to(torch.int32)
    return {"q": q, "k": k, "v": v, "k_buf": k_buf, "v_buf": v_buf, "table": table, "lens": lens,
            "req_idx": as_t(list(range(len(lens)))), "prefix": as_t([0] * len(lens)), "ext": as_t(lens),
            "starts": as_t(starts), "cu": cu, "scale": D ** -0.5}


def _triton(x: dict) -> torch.Tensor:
    from radixflow.kernels.extend_attention import extend_attention

    return extend_attention(x["q"], x["k_buf"], x["v_buf"], x["table"], x["req_idx"], x["prefix"], x["ext"],
                            x["starts"], max(x["lens"]), x["scale"])


def _flash(x: dict, expand: bool = False) -> torch.Tensor:
    k, v = x["k"], x["v"]
    if expand:
        k, v = k.repeat_interleave(HQ // HKV, dim=1), v.repeat_interleave(HQ // HKV, dim=1)
    m = max(x["lens"])
    out = torch.ops.aten._flash_attention_forward(x["q"], k, v, x["cu"], x["cu"], m, m, 0.0, True, False,
                                                  scale=x["scale"])
    return out[0]


def _cudnn_dense(x: dict, expand: bool = False) -> torch.Tensor:
    """Equal-length rows only: torch's SDPA on its cuDNN backend over [B, H, L, D] views of the packed q / k / v
    (Hopper's cuDNN attention, against FlashAttention-2 above), back to [T, Hq, D]."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    lens = x["lens"]
    assert len(set(lens)) == 1, "the dense layout needs equal lengths"
    views = [t.view(len(lens), lens[0], t.shape[1], D).transpose(1, 2) for t in (x["q"], x["k"], x["v"])]
    if expand:
        views[1:] = [t.repeat_interleave(HQ // HKV, dim=1) for t in views[1:]]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(*views, is_causal=True, scale=x["scale"],
                                                               enable_gqa=not expand)
    return out.transpose(1, 2).reshape(-1, HQ, D)


CANDIDATES = {"triton": _triton, "flash_varlen": _flash, "flash_expanded": lambda x: _flash(x, expand=True),
              "cudnn_dense": _cudnn_dense, "cudnn_dense_expanded": lambda x: _cudnn_dense(x, expand=True)}


def _check(fn, x: dict, n_check: int) -> float:
    """Max abs error of fn against the torch reference on the first n_check prompts."""
    from radixflow.kernels.reference import extend_attention_ref

    lens = x["lens"][:n_check]
    sub = _inputs(lens) if n_check < len(x["lens"]) else x
    got = fn(sub)
    want = extend_attention_ref(sub["q"], sub["k_buf"], sub["v_buf"], sub["table"], sub["req_idx"], sub["prefix"],
                                sub["ext"], sub["scale"])
    return float((got.float() - want.float()).abs().max())


def _gpu_time(fn) -> float:
    """GPU seconds per call with the host's launch time left out (queued calls); a wall clock on the CPU."""
    if DEV != "cuda":
        return cuda_time(fn, SZ["pa_reps"])
    from cuda_timing import cuda_queued_s

    return cuda_queued_s(fn, reps=SZ["pa_reps"])


# (rows, length) of equal-length prompt passes: flash against the engine's cuDNN path (kernels/cudnn_dense.py)
DENSE_SHAPES = ((1, 1024), (8, 1024), (1, 2048), (4, 2048), (2, 4096), (1, 8192))


def _dense_shapes() -> dict:
    """Per shape: flash and the engine's cuDNN call (us), and the first cuDNN call's wall ms at that shape (its
    graph build; the probe and earlier cases built others)."""
    import time

    from radixflow.kernels.cudnn_dense import cudnn_dense_attention

    out = {}
    for rows, length in DENSE_SHAPES:
        x = _inputs([length] * rows)
        q, k, v = x["q"], x["k"], x["v"]
        dense = lambda: cudnn_dense_attention(q, k, v, rows, length, x["scale"])  # noqa: E731
        try:
            torch.cuda.synchronize()
            t = time.perf_counter()
            dense()
            torch.cuda.synchronize()
            first_ms = 1e3 * (time.perf_counter() - t)
            res = {"cudnn_first_call_ms": round(first_ms, 2), "cudnn_us": round(1e6 * _gpu_time(dense), 1),
                   "flash_us": round(1e6 * _gpu_time(lambda: _flash(x)), 1)}
            res["speedup"] = round(res["flash_us"] / res["cudnn_us"], 3)
            res["max_abs_diff_vs_flash"] = float((dense().float() - _flash(x).float()).abs().max())
        except Exception as e:  # noqa: BLE001 - recorded
            res = {"error": repr(e)[:300]}
        out[f"{rows}x{length}"] = res
    return out


def sec_prefill_attention() -> dict:
    out = {"dense_shapes": _dense_shapes()} if DEV == "cuda" else {}
    for case in ("offline_chunk", "4x2048"):
        lens = _case_lengths(case)
        x = _inputs(lens)
        flops = 4 * HQ * D * sum(n * (n + 1) / 2 for n in lens)
        res = {"prompts": len(lens), "tokens": sum(lens)}
        for name, fn in CANDIDATES.items():
            if name.startswith("cudnn") and len(set(lens)) > 1:
                continue
            try:
                err = _check(fn, x, SZ["pa_check"])
                s = _gpu_time(lambda fn=fn: fn(x))
                res[name] = {"max_abs_err": err, "us": s * 1e6, "TFLOPs": flops / s / 1e12}
            except Exception as e:  # noqa: BLE001 - recorded: a candidate this torch or device does not run
                res[name] = {"error": repr(e)[:300]}
        base = res["triton"].get("us")
        for name in CANDIDATES:
            if base and "us" in res.get(name, {}):
                res[name]["speedup_vs_triton"] = base / res[name]["us"]
        out[case] = res
    return out
