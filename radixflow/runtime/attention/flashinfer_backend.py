"""FlashInfer backend: not implemented in this tree.

FlashInfer is not installed on the GPU hosts radixflow is benchmarked on and cannot
be fetched there (no network; its kernels are JIT-built per shape), so an adapter
could not be tested. Selecting it raises a clear error instead of failing later.
"""

from __future__ import annotations

from radixflow.errors import RadixflowError


class FlashInferBackend:
    def __init__(self, **kwargs):
        try:
            import flashinfer  # noqa: F401
        except ImportError:
            raise RadixflowError(
                "attention_backend=flashinfer needs the flashinfer package; use triton (the default on CUDA)"
            ) from None
        raise RadixflowError("the flashinfer backend is not implemented yet; use attention_backend=triton")
