"""Attention backends over the paged KV pool."""

from radixflow.errors import RadixflowError
from radixflow.runtime.execution.attention.base import AttentionBackend


def create_attention_backend(name: str, device: str, **kwargs) -> AttentionBackend:
    """The backend `--attention-backend` names ("auto": triton on CUDA, torch_native on CPU). It lives
    here, not beside the base class, so that no backend module imports the modules that subclass it."""
    if name == "auto":
        name = "triton" if device == "cuda" else "torch_native"
    if name == "torch_native":
        from radixflow.runtime.execution.attention.torch_native import TorchNativeBackend

        return TorchNativeBackend(**kwargs)
    if name == "triton":
        if device != "cuda":
            raise RadixflowError("attention_backend=triton needs a CUDA device; use torch_native on CPU")
        from radixflow.runtime.execution.attention.triton_backend import TritonBackend

        return TritonBackend(**kwargs)
    if name == "flashinfer":
        from radixflow.runtime.execution.attention.flashinfer_backend import FlashInferBackend

        return FlashInferBackend(**kwargs)
    raise RadixflowError(f"unknown attention backend {name!r}: choose triton, torch_native or flashinfer")


__all__ = ["AttentionBackend", "create_attention_backend"]
