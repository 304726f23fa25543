"""Torch references for the Triton kernels: the semantics each kernel must reproduce.

Plain torch, no Triton import, so they run anywhere. Rounding follows the model's
torch path (runtime/execution/layers): sums and normalisation in float32, results rounded to
the input dtype at the same points.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """norm(x [+ residual]) * weight in x's dtype; with residual also returns x + residual in
    the residual's dtype (which may be float32 while x is bf16), normalised as rounded."""
    dtype = x.dtype
    if residual is not None:
        x = (x.float() + residual.float()).to(residual.dtype)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * h.to(dtype)
    return out if residual is None else (out, x)


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x: [T, 2I] = [gate | up] -> silu(gate) * up."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def rotary_ref(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotate-half rotary; cos/sin: [max_pos, D] float32 (first half == second half)."""
    c = cos[positions].unsqueeze(1)
    s = sin[positions].unsqueeze(1)

    def apply(x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        half = x.shape[-1] // 2
        rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
        return (xf * c + rotated * s).to(x.dtype)

    return apply(q), apply(k)


def store_kv_ref(k_buf: torch.Tensor, v_buf: torch.Tensor, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    k_buf[loc] = k.to(k_buf.dtype)
    v_buf[loc] = v.to(v_buf.dtype)


def rotary_store_kv_ref(positions, q, k, v, cos, sin, k_buf, v_buf, loc):
    """q/k rotated in place, then the rotated k and v stored at `loc`; returns (q, k)."""
    rq, rk = rotary_ref(positions, q, k, cos, sin)
    q.copy_(rq)
    k.copy_(rk)
    store_kv_ref(k_buf, v_buf, loc, k, v)
    return q, k


def gemv_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T (+ bias) accumulated in float32, rounded once to x's dtype."""
    b = None if bias is None else bias.float()
    return F.linear(x.float(), weight.float(), b).to(x.dtype)


def fp8_linear_ref(x: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """kernels/fp8.py's GEMM: x quantized to e4m3 per row (scale max|x|/448), times the e4m3 weight [N, K],
    both scales applied to the float32 product, + bias, rounded once to x's dtype."""
    xf = x.float()
    xs = (xf.abs().amax(dim=-1, keepdim=True) * INV_FP8_MAX).clamp(min=1e-12)
    xq = (xf / xs).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    out = (xq @ wq.float().t()) * xs * w_scale.float().view(1, -1)
    return (out if bias is None else out + bias.float()).to(x.dtype)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [M, Hq, D], k/v: [N, Hkv, D], mask: [M, N] bool -> [M, Hq, D], in float32."""
    group = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,nhd->hmn", q.float(), kf) * scale
    scores = scores.masked_fill(~mask.unsqueeze(0), float("-inf"))
    return torch.einsum("hmn,nhd->mhd", scores.softmax(dim=-1), vf)


def decode_attention_ref(q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, scale: float) -> torch.Tensor:
    """One query per request over its first seq_len tokens. q: [B, Hq, D]."""
    outs = []
    for b in range(q.shape[0]):
        n = int(seq_lens[b])
        slots = req_to_token[int(req_pool_indices[b]), :n].long()
        mask = torch.ones(1, n, dtype=torch.bool, device=q.device)
        outs.append(_attend(q[b : b + 1], k_buf[slots], v_buf[slots], mask, scale))
    return torch.cat(outs).to(q.dtype)


def extend_attention_ref(q, k_buf, v_buf, req_to_token, req_pool_indices, prefix_lens, extend_lens, scale: float):
    """New tokens (request-major in q) attend to the cached prefix and causally to themselves.
    Their own K/V must already be in the pool."""
    outs, start = [], 0
    for b in range(len(extend_lens)):
        pre, ext = int(prefix_lens[b]), int(extend_lens[b])
        slots = req_to_token[int(req_pool_indices[b]), : pre + ext].long()
        qpos = torch.arange(pre, pre + ext, device=q.device).unsqueeze(1)
        kpos = torch.arange(pre + ext, device=q.device).unsqueeze(0)
        outs.append(_attend(q[start : start + ext], k_buf[slots], v_buf[slots], kpos <= qpos, scale))
        start += ext
    return torch.cat(outs).to(q.dtype)


# -- FP8 (e4m3): torch-only, so loading an FP8 model needs no Triton -------------------------------
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
# Scales are max|x| times this float32 reciprocal, not max|x| / 448: torch on CUDA divides a tensor by a
# Python number that way while torch on the CPU divides exactly, and the two differ by an ulp in about
# half the rows, which moves quantized values that sit on a rounding boundary. Multiplying gives the same
# bits on both devices and in the Triton kernel.
INV_FP8_MAX = 1.0 / FP8_MAX
MIN_SCALE = 1e-12  # an all-zero row keeps a positive scale (and quantizes to zeros)


def quantize_rows_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, K] -> (q [R, K] float8_e4m3fn, s [R] float32) with x ~ q * s[:, None]."""
    xf = x.float()
    scale = (xf.abs().amax(dim=-1) * INV_FP8_MAX).clamp(min=MIN_SCALE)
    q = (xf / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale
