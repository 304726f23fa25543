"""Rotary position embedding (rotate-half layout) with the config's rope scaling."""

from __future__ import annotations

import torch
from torch import nn

from radixflow.kernels.settings import KernelSettings


def rope_params(config) -> dict:
    """The config's rope scaling (transformers 5's rope_parameters, or rope_scaling), with its rope_theta."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    params = dict(params)
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return params


def compute_inv_freq(config, head_dim: int) -> tuple[torch.Tensor, float]:
    params = rope_params(config)
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type == "default":
        base = float(params["rope_theta"])
        inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        return inv, 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv, scale = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
    return inv.float(), float(scale)


class RotaryEmbedding(nn.Module):
    def __init__(self, config, head_dim: int, max_positions: int):
        super().__init__()
        self.kernels: KernelSettings | None = None  # the Triton kernel (in place), so launched, on CUDA tensors
        inv_freq, self.attention_scaling = compute_inv_freq(config, head_dim)
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos() * self.attention_scaling, persistent=False)
        self.register_buffer("sin", emb.sin() * self.attention_scaling, persistent=False)
        self._cached_for, self._cached = None, None

    def new_pass(self) -> None:
        """Forget the cos/sin rows gathered for the last pass. A position buffer can be refilled in
        place between passes (a CUDA graph's: captured right after a warm-up pass on the same
        tensor, the graph would otherwise bake in the warm-up's rows instead of gathering)."""
        self._cached_for, self._cached = None, None

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """q: [T, Hq, D], k: [T, Hkv, D]; positions: [T]. With Triton kernels, q and k are rotated in place."""
        if self.kernels is not None and q.is_cuda:
            from radixflow.kernels.rotary import apply_rotary

            return apply_rotary(positions, q, k, self.cos, self.sin, self.kernels)
        if self._cached_for is not positions:  # every layer of a pass rotates by the same positions
            self._cached = (self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1))
            self._cached_for = positions
        cos, sin = self._cached
        return _apply(q, cos, sin), _apply(k, cos, sin)


def _apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    dtype = x.dtype
    xf = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos + rotated * sin).to(dtype)
