"""Attention backends over the paged KV pool."""

from radixflow.errors import RadixflowError
from radixflow.runtime.execution.attention.base import AttentionBackend


def attention_backend_class(name: str, device: str) -> type[AttentionBackend]:
    """The class `--attention-backend` names ("auto": triton on CUDA, torch_native on CPU), so that its
    capabilities can be read before the KV pool it is built over exists. It lives here, not beside the
    base class, so that no backend module imports the modules that subclass it."""
    if name == "auto":
        name = "triton" if device == "cuda" else "torch_native"
    if name == "torch_native":
        from radixflow.runtime.execution.attention.torch_native import TorchNativeBackend

        return TorchNativeBackend
    if name == "triton":
        if device != "cuda":
            raise RadixflowError("attention_backend=triton needs a CUDA device; use torch_native on CPU")
        from radixflow.runtime.execution.attention.triton_backend import TritonBackend

        return TritonBackend
    if name == "flashinfer":
        from radixflow.runtime.execution.attention.flashinfer_backend import FlashInferBackend

        return FlashInferBackend
    raise RadixflowError(f"unknown attention backend {name!r}: choose triton, torch_native or flashinfer")


def create_attention_backend(name: str, device: str, **kwargs) -> AttentionBackend:
    return attention_backend_class(name, device)(**kwargs)


__all__ = ["AttentionBackend", "attention_backend_class", "create_attention_backend"]
