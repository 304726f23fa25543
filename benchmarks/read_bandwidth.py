"""HBM read bandwidth: bytes per second a kernel that only reads can stream (CUDA only).

A batch-1 decode step only reads its weights, so its roofline is weight bytes over this rate.
A device copy (read + write) measures a little less than pure reads on an H200: session 5's
gate_up GEMV streamed 4.29 TB/s where copies read 4.13-4.25. So the benchmarks take the highest
of these readings as the ceiling:

- `triton_sum_*`: each program sums `iters` tiles of `block` bf16 values into one float32;
- `torch_sum`: torch's own reduction over the same buffer.

Each is the median of `reps` timed calls after a warm-up of about 0.1 s.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from cuda_timing import cuda_median_s

CONFIGS = ({"block": 4096, "iters": 16, "num_warps": 8, "num_stages": 3},
           {"block": 2048, "iters": 32, "num_warps": 4, "num_stages": 4})


@triton.jit
def _sum_kernel(X, Out, N, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * BLOCK * ITERS
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(X + offs, mask=offs < N, other=0.0).to(tl.float32)
    tl.store(Out + tl.program_id(0), tl.sum(acc))


def read_bandwidths(gib: int = 2, reps: int = 30) -> dict[str, float]:
    """{probe: bytes read per second} over a `gib` GiB bf16 buffer."""
    x = torch.randn(gib << 29, device="cuda", dtype=torch.bfloat16)
    n, nbytes = x.numel(), x.numel() * x.element_size()
    out: dict[str, float] = {}
    for cfg in CONFIGS:
        grid = triton.cdiv(n, cfg["block"] * cfg["iters"])
        partial = torch.empty(grid, device="cuda", dtype=torch.float32)

        def run(cfg=cfg, grid=grid, partial=partial):
            _sum_kernel[(grid,)](x, partial, n, BLOCK=cfg["block"], ITERS=cfg["iters"],
                                 num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])

        for _ in range(50):
            run()
        chunk = cfg["block"] * cfg["iters"]
        assert n % chunk == 0
        want = x.view(grid, chunk).sum(dim=1, dtype=torch.float32)  # it read what it claims, chunk by chunk
        assert torch.allclose(partial, want, rtol=1e-4, atol=1e-2), float((partial - want).abs().max())
        out[f"triton_sum_b{cfg['block']}_i{cfg['iters']}"] = nbytes / cuda_median_s(run, reps)
    for _ in range(50):
        x.sum()
    out["torch_sum"] = nbytes / cuda_median_s(lambda: x.sum(), reps)
    return out
