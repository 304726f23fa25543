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
                   disable_fp8_fast_accum=True, native_attention_dtype="float64").kernel_settings()
    assert s == KernelSettings(pdl=False, pdl_early_trigger=False, attention_p_parts=1, fused_kernels=False,
                               fused_rotary_max_batch=4, fp32_residual=False, triton_sampling=False,
                               fp8_activations=False, fp8_fast_accum=False, native_attention_dtype="float64")
    det = ServerArgs(enable_deterministic_inference=True).kernel_settings()
    assert det.batch_invariant and det.fused_rotary_max_batch == 0  # one rotary kernel at every batch size
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
