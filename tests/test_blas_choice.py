"""kernels/blas_choice.py: which row counts a linear layer sends to cuBLASLt, and that the choice is timed on CUDA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixflow.kernels.blas_choice import LT_MS, MARGIN, NO_LT, LtRows, choose_lt_rows, linear_lt


def test_lt_rows_use_the_nearest_timed_m_at_or_above():
    rows = LtRows((16, 64, 256), (False, True, False))
    assert [rows(m) for m in (9, 16, 17, 40, 64, 65, 256, 257, 4096)] == \
        [False, False, True, True, True, False, False, False, False]
    assert not any(NO_LT(m) for m in (1, 64, 10_000))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuBLASLt is CUDA's")
def test_gpu_choose_lt_rows_times_both_and_linear_lt_matches():
    layers = [(torch.randn(512, 256, device="cuda", dtype=torch.bfloat16), None) for _ in range(2)]
    before = torch.backends.cuda.preferred_blas_library()
    rows, timings = choose_lt_rows(layers, ms=(16, 64), rounds=1, reps=2)
    assert torch.backends.cuda.preferred_blas_library() == before
    assert rows.bounds == (16, 64) and len(rows.lt) == 2 and set(timings) == {16, 64}
    assert all(b > 0 and t > 0 for b, t in timings.values())
    wins = [t < (1 - MARGIN) * b for b, t in timings.values()]
    assert rows.lt == (wins[0], wins[0] and wins[1])  # rows 17-64 need a win at 16 and at 64
    x = torch.randn(40, 256, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(linear_lt(x, layers[0][0]), F.linear(x, layers[0][0]), rtol=2e-2, atol=2e-2)
    assert torch.backends.cuda.preferred_blas_library() == before
    assert LT_MS[-1] == 256  # prefill-sized batches stay on cuBLAS
