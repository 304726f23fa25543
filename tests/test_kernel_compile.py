"""Every decode-path Triton kernel compiles for sm_90 (H100/H200), checked on a machine without a GPU.

The interpreter tests (test_kernels.py) miss compile-only errors; tests/sm90_compile.py compiles each
kernel with Triton's own ptxas. It runs in its own process because TRITON_INTERPRET, which
test_kernels.py sets, must be unset when the kernels are imported.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_decode_kernels_compile_for_sm90():
    # not imported at module level: test_kernels.py must be the first to import triton, after
    # setting TRITON_INTERPRET
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "sm90_compile.py")],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert "FAIL" not in out.stdout and out.stdout.count("ok ") == 31  # sm90_compile.main's checks
