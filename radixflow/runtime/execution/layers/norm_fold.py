"""The RMSNorm weights folded into the linears that read the norms' outputs, at load (issue 28).

norm(h) @ W.T = (h * rstd(h) * g) @ W.T = rstd(h) * (h @ (W * g).T), so with W' = W * g (in float32, then the
model's dtype; before FP8 quantization) a norm only scales by rstd and its weight becomes ones. On the
GEMM path the norm kernels run as before with that unit weight; on the batch-1..8 GEMV path they go:
kernels/gemv_epilogue.py applies rstd in the epilogue of the GEMV that reads the un-normalised stream,
and the GEMV before it (o_proj, down) adds the residual and sums the squares
(models/llama_epilogue.py). gate_up's rows are interleaved (gate i, up i) so one program owns both
halves of a SiLU-and-mul pair; every path that splits gate_up reads that layout (`MLP.interleaved`).
The final norm keeps its weight: the output head is cuBLAS's, not the GEMV.

`fold_off_reason` (at load) and `settings_off_reason` (its part the model checks again when the settings
change) are the one rule for where this applies.
"""

from __future__ import annotations

import torch

from radixflow.kernels.settings import KernelSettings


def settings_off_reason(settings: KernelSettings, fused: bool) -> str | None:
    """The rule's part that depends on the kernel settings, which can change after load: the model checks it
    on every `set_kernel_settings` (a folded model with it off runs the norm kernels, weight ones; turned on
    after a load that did not fold, it does nothing). fused: the norms and SiLU-and-mul run as Triton kernels
    (settings.fused_kernels and the backend's `fused_kernels`). None: on."""
    if not settings.gemv_epilogue:
        return "--disable-gemv-epilogue"
    if settings.batch_invariant:
        return "deterministic inference (every linear on kernels/matmul.py, none on the GEMV)"
    if not fused:
        return "the model's norms and SiLU-and-mul are not Triton kernels (torch-native backend, --disable-fused-kernels)"
    return None


def fold_off_reason(settings: KernelSettings, device: str, tp_size: int, backend: type, prequantized: bool,
                    biased: bool = False) -> str | None:
    """Why the fold and the GEMV epilogues stay off for this engine, at load; None: on. backend: the attention
    backend's class; its `gemv_epilogues` says the epilogue pass was tested with it (not FlashInfer's). biased: the
    model's linears have biases."""
    if not settings.gemv_epilogue:
        return "--disable-gemv-epilogue"
    if device != "cuda":
        return "not CUDA (the epilogue kernels are Triton's; the CPU has no GEMV path)"
    if tp_size > 1:
        return "tensor parallel (a row's sum of squares would span the ranks' slices)"
    why = settings_off_reason(settings, settings.fused_kernels and getattr(backend, "fused_kernels", False))
    if why:
        return why
    if not getattr(backend, "gemv_epilogues", False):
        return f"{backend.__name__}: the folded model is not tested with this attention backend"
    if prequantized:
        return "a pre-quantized FP8 checkpoint (folding needs the weights before quantization)"
    if biased:  # the H200 check (session 11): 2.1x the unfolded engine's logprob error vs float32, not yet explained
        return "linear biases (the folded path with biases is not yet as close to float32 as the unfolded one)"
    return None


def interleave_rows(w: torch.Tensor, parts: int) -> torch.Tensor:
    """[parts * n, ...] as blocks [p0; p1; ...] -> rows p0[0], p1[0], ..., p0[1], ... (a new tensor)."""
    return w.reshape(parts, -1, *w.shape[1:]).transpose(0, 1).reshape(w.shape).contiguous()


def deinterleave_rows(w: torch.Tensor, parts: int) -> torch.Tensor:
    """The inverse of `interleave_rows`."""
    return w.reshape(-1, parts, *w.shape[1:]).transpose(0, 1).reshape(w.shape).contiguous()


@torch.no_grad()
def _fold(norm: torch.nn.Module, linear: torch.nn.Module) -> None:
    w = linear.weight
    assert w.dtype != torch.float8_e4m3fn, "fold before quantizing"
    w.copy_((w.float() * norm.weight.float()).to(w.dtype))
    norm.weight.fill_(1.0)


@torch.no_grad()
def fold_norms(model) -> None:
    """Fold every decoder layer's two norm weights into qkv / gate_up and interleave gate_up's rows, in place.
    Once: a second fold would interleave the rows again."""
    assert not model.folded, "the norms are already folded"
    for layer in model.layers:
        _fold(layer.input_layernorm, layer.self_attn.qkv_proj)
        _fold(layer.post_attention_layernorm, layer.mlp.gate_up_proj)
        gate_up = layer.mlp.gate_up_proj
        gate_up.weight.copy_(interleave_rows(gate_up.weight, 2))
        if gate_up.bias is not None:
            gate_up.bias.copy_(interleave_rows(gate_up.bias, 2))
        layer.mlp.interleaved = True
    model.folded = True
