"""Does a pointer's alignment make Triton compile another extend-kernel variant, and do the forward
pass's index tensors now all start 16-byte aligned? (issue 29: rounds that compiled a variant mid-run.)

    python benchmarks/jit_alignment_probe.py --device cuda

Prints the variants `_extend_kernel` compiled for metadata tensors that start 16-byte aligned, then for
the same values one int64 into a buffer (8 bytes off), and the alignment of every index tensor of
build_forward_batch for passes with odd and even token and request counts."""

from __future__ import annotations

import argparse
import os
import sys
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "programs"))
from jit_variants import compiled_variants  # noqa: E402

from radixflow.kernels.extend_attention import extend_attention, warm_up  # noqa: E402
from radixflow.runtime.execution.forward_batch import ForwardMode  # noqa: E402
from radixflow.runtime.scheduling.forward_inputs import build_forward_batch  # noqa: E402


def variants() -> int:
    return compiled_variants().get("extend_attention._extend_kernel", 0)


def launch(dev: str, offset: int, hq: int = 32, hkv: int = 8, d: int = 128) -> None:
    """One request of 3 new tokens after 5 cached, its metadata `offset` int64s into their buffers."""
    k = torch.randn(64, hkv, d, device=dev, dtype=torch.bfloat16)
    table = torch.arange(64, dtype=torch.int32, device=dev).view(1, 64)
    meta = lambda v: torch.tensor([0] * offset + [v], dtype=torch.int64, device=dev)[offset:]  # noqa: E731
    q = torch.randn(3, hq, d, device=dev, dtype=torch.bfloat16)
    extend_attention(q, k, k, table, meta(0), meta(5), meta(3), meta(0), 3, d**-0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    dev = ap.parse_args().device
    k = torch.zeros(64, 8, 128, device=dev, dtype=torch.bfloat16)
    warm_up(torch.bfloat16, k, k, 32, torch.zeros(1, 64, dtype=torch.int32, device=dev))
    base = variants()
    launch(dev, 0)
    aligned = variants()
    launch(dev, 1)
    print(f"extend-kernel variants: {base} after the warm-up, {aligned} after an aligned launch, "
          f"{variants()} after the same launch with its metadata 8 bytes off")
    for tokens, reqs in [(7, 3), (8, 3), (7, 2), (8, 2)]:
        batch = [(SimpleNamespace(req_pool_idx=i), 1) for i in range(reqs)]
        ext = [1] * (reqs - 1) + [tokens - reqs + 1]
        fb = build_forward_batch(torch.device(dev), ForwardMode.EXTEND, list(range(tokens)), torch.arange(tokens),
                                 torch.arange(tokens), batch, [0] * reqs, ext, [[tokens - 1]])
        names = ["input_ids", "positions", "out_cache_loc", "req_pool_indices", "seq_lens", "prefix_lens",
                 "extend_lens", "logits_indices"]
        off = {n: getattr(fb, n).data_ptr() % 16 for n in names}
        print(f"{tokens} tokens, {reqs} requests: byte offsets mod 16 {off}")


if __name__ == "__main__":
    main()
