"""cuBLAS or cuBLASLt for a linear layer's decode-sized batches, chosen by timing both on the model's weights.

torch sends `F.linear` without a bias to cuBLAS's gemm; with cuBLASLt preferred
(`torch.backends.cuda.preferred_blas_library`) it asks cuBLASLt's heuristic instead, which picks other kernels
at a few dozen rows. Neither wins everywhere: on an H200 (Llama-3-8B shapes, gpu_bench.py decode_gemm, session
22) cuBLASLt took 4096 x 14,336 (down) at 64 rows in 31.9 us against 37.2 and 4096 x 4096 (o_proj) at 40 rows
in 11.9 against 14.0, but down at 200 rows in 52.3 against 43.7. So `choose_lt_rows` times both at each of LT_MS
rows, and a layer runs cuBLASLt for the row counts between two timed Ms where it won by MARGIN at both (the
first timed M alone for the rows up to it): winning at 256 rows alone had down on cuBLASLt at 200, 0.19 ms a
decode step slower.
The choice is made before the decode CUDA graphs are captured, which bake it in. Layers use cuBLASLt inside
a CUDA graph capture only: torch asks cuBLASLt's heuristic for an algorithm on every call, a host cost that a
graph pays once at capture but an eager pass would pay on every linear (an A/B of the program suite with
cuBLASLt in eager passes too had graph mode's host-only time up on 8 of 10 workloads).
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

LT_MS = (16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)  # rows timed; above the last, cuBLAS (prefill-sized batches)
MARGIN = 0.03  # cuBLASLt must be this much faster (a fraction of cuBLAS's time) to be used
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LtRows:
    """Row counts that run through cuBLASLt: M in (bounds[i - 1], bounds[i]] where lt[i]."""

    bounds: tuple[int, ...] = ()
    lt: tuple[bool, ...] = ()

    def __call__(self, m: int) -> bool:
        i = bisect.bisect_left(self.bounds, m)
        return i < len(self.lt) and self.lt[i]


NO_LT = LtRows()


def linear_lt(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear through cuBLASLt (torch's preferred BLAS for this call only)."""
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        return F.linear(x, weight, bias)
    finally:
        torch.backends.cuda.preferred_blas_library(before)


@torch.inference_mode()
def choose_lt_rows(layers: Sequence[tuple], ms: Sequence[int] = LT_MS, rounds: int = 3,
                   reps: int = 5) -> tuple[LtRows, dict[int, tuple[float, float]]]:
    """Time F.linear through cuBLAS and cuBLASLt at each M in `ms` over `layers` ((weight, bias) of one shape,
    taken in turn so the L2 cache holds what it holds in a real step), each the best of `rounds` interleaved
    timings in a CUDA graph. Returns the LtRows (cuBLASLt between two Ms where it won at both) and
    {M: (cublas_us, cublaslt_us)}."""
    from radixflow.kernels.gemv import best_of_rounds, capture_graph

    w0 = layers[0][0]
    calls = max(len(layers), 8)
    timings, wins = {}, []
    for m in ms:
        x = torch.randn(m, w0.shape[1], dtype=w0.dtype, device=w0.device)
        try:
            graphs = {name: capture_graph(lambda i, fn=fn: fn(x, *layers[i % len(layers)]), calls)
                      for name, fn in (("cublas", F.linear), ("lt", linear_lt))}
        except RuntimeError as e:  # a torch build without cuBLASLt (or hipBLASLt): cuBLAS throughout
            log.warning("cuBLASLt not timed (%s): linear layers stay on cuBLAS", e)
            return NO_LT, {}
        us = best_of_rounds(graphs, calls, rounds, reps)
        timings[m] = (us["cublas"], us["lt"])
        wins.append(us["lt"] < (1 - MARGIN) * us["cublas"])
    lt = tuple(w and (i == 0 or wins[i - 1]) for i, w in enumerate(wins))
    return LtRows(tuple(ms), lt), timings
