"""Kernel and precision choices are one frozen KernelSettings derived from ServerArgs (flags in
--help), handed to the layers, the attention backend and the sampler; changing them goes through
the model runner, which hands the new ones down (and captures CUDA graphs again)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from radixflow.errors import RadixflowError
from radixflow.kernels.settings import DEFAULT_KERNEL_SETTINGS, KernelSettings
from radixflow.runtime.server_args import ServerArgs


def test_server_args_derive_the_settings():
    assert ServerArgs().kernel_settings() == DEFAULT_KERNEL_SETTINGS
    s = ServerArgs(disable_pdl=True, pdl_late_trigger=True, attention_p_parts=1, disable_fused_kernels=True,
                   fused_rotary_max_batch=4, bf16_residual=True, disable_triton_sampling=True, fp8_weight_only=True,
                   native_attention_dtype="float64", split_gate_up=True).kernel_settings()
    assert s == KernelSettings(pdl=False, pdl_early_trigger=False, attention_p_parts=1, fused_kernels=False,
                               fused_rotary_max_batch=4, fp32_residual=False, triton_sampling=False,
                               fp8_activations=False, native_attention_dtype="float64", split_gate_up=True)
    det = ServerArgs(enable_deterministic_inference=True, split_gate_up=True).kernel_settings()
    assert det.batch_invariant and det.fused_rotary_max_batch == 0  # one rotary kernel at every batch size
    assert not det.split_gate_up  # deterministic inference: every matmul through kernels/matmul.py
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.pdl = True


@pytest.mark.parametrize("kw,needle", [({"attention_p_parts": 3}, "attention_p_parts"),
                                       ({"fused_rotary_max_batch": -1}, "fused_rotary_max_batch"),
                                       ({"native_attention_dtype": "float16"}, "native_attention_dtype")])
def test_bad_settings_are_refused(kw, needle):
    with pytest.raises(RadixflowError, match=needle):
        ServerArgs(**kw)


def test_changed_settings_reach_the_layers_and_the_backend(engine):
    runner = engine.runner
    before = runner.settings
    params = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
    want = engine.generate("The capital of France is", params)["output_ids"]
    stream = torch.float32 if before.fp32_residual else None
    assert runner.model.layers[0].residual_dtype == stream
    try:
        engine.stepper.exclusive(lambda: runner.set_kernel_settings(
            dataclasses.replace(before, fp32_residual=False, native_attention_dtype="float64")))
        assert runner.settings.native_attention_dtype == "float64" and runner.backend.settings is runner.settings
        assert all(layer.residual_dtype is None for layer in runner.model.layers)
        got = engine.generate("The capital of France is", params)["output_ids"]
        assert len(got) == len(want)
        with pytest.raises(AssertionError, match="batch_invariant"):
            runner.set_kernel_settings(dataclasses.replace(before, batch_invariant=not before.batch_invariant))
    finally:
        engine.stepper.exclusive(lambda: runner.set_kernel_settings(before))
    assert runner.model.layers[0].residual_dtype == stream
    assert engine.generate("The capital of France is", params)["output_ids"] == want


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_linear_is_the_same_product(dtype):
    from radixflow.runtime.execution.layers.parallel_linear import split_linear

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(37, 64, generator=g).to(dtype), torch.randn(96, 64, generator=g).to(dtype)
    got, want = split_linear(x, w, 2), x.float() @ w.float().t()
    assert got.shape == (37, 96) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want, rtol=2e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-4)


def test_split_gate_up_reaches_only_the_gate_up_projections(engine):
    from radixflow.runtime.execution.models.llama import MLP

    runner = engine.runner
    before = runner.settings
    mlp = next(m for m in runner.model.modules() if isinstance(m, MLP))
    x = torch.randn(5, runner.model.shape.hidden, generator=torch.Generator().manual_seed(1)).to(mlp.gate_up_proj.weight.dtype)
    params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    want_ids = engine.generate("The capital of France is", params)["output_ids"]
    with torch.inference_mode():
        want = mlp(x)
    try:
        engine.stepper.exclusive(lambda: runner.set_kernel_settings(dataclasses.replace(before, split_gate_up=True)))
        parts = {name: m.gemm_parts for name, m in runner.model.named_modules() if hasattr(m, "gemm_parts")}
        assert {n for n, p in parts.items() if p == 2} == {n for n in parts if n.endswith("mlp.gate_up_proj")}
        with torch.inference_mode():
            # the same sums in another order (oneDNN's one GEMM against torch.mm's two): float32 rounding apart
            torch.testing.assert_close(mlp(x), want, rtol=1e-4, atol=1e-3)
        assert engine.generate("The capital of France is", params)["output_ids"] == want_ids
    finally:
        engine.stepper.exclusive(lambda: runner.set_kernel_settings(before))
    assert all(p == 1 for m in runner.model.modules() for p in [getattr(m, "gemm_parts", 1)])
