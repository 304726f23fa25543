"""Sections env, ceilings, pytest: what the machine is and what it can do at most."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from gpubench.common import DEV, OPTS, RESULTS, ROOT, cuda_time, free


def sec_env() -> dict:
    import importlib.util

    import triton
    import transformers

    missing = [m for m in ("zmq", "fastapi", "uvicorn", "outlines_core", "flashinfer") if importlib.util.find_spec(m) is None]
    query = ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit", "--format=csv"]
    smi = subprocess.run(query, capture_output=True, text=True).stdout.strip() if DEV == "cuda" else ""
    return {"torch": torch.__version__, "triton": triton.__version__, "transformers": transformers.__version__,
            "gpu": torch.cuda.get_device_name() if DEV == "cuda" else "cpu", "missing_packages": missing, "nvidia_smi": smi}


def copy_bandwidth() -> float:
    """Bytes read + written per second by a 2 GiB device-to-device copy (median of 30), after
    ~0.1 s of copies: one warm-up copy had read 4.15 and 4.26 TB/s minutes apart on one machine."""
    src = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    for _ in range(100):
        dst.copy_(src)
    return 2 * src.numel() * src.element_size() / cuda_time(lambda: dst.copy_(src), 30)


def _matmul_rate() -> float:
    """bf16 FLOP/s of an 8192^3 product on random data."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    return 2 * 8192**3 / cuda_time(lambda: a @ b, 10)


def read_bandwidth() -> dict:
    """{probe: TB/s} of kernels that only read (benchmarks/read_bandwidth.py)."""
    from read_bandwidth import read_bandwidths

    return {name: bps / 1e12 for name, bps in read_bandwidths().items()}


def _fp8_matmul_rate() -> float:
    """e4m3 FLOP/s of an 8192^3 torch._scaled_mm with row-wise scales and bf16 output, accumulated as the FP8
    linear's GEMM is (KernelSettings.fp8_fast_accum: fast since session 33, float32 partial sums before)."""
    from radixflow.kernels.settings import DEFAULT_KERNEL_SETTINGS

    a = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
    sa, sb = torch.ones(8192, 1, device="cuda"), torch.ones(1, 8192, device="cuda")
    mm = lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,  # noqa: E731
                                  use_fast_accum=DEFAULT_KERNEL_SETTINGS.fp8_fast_accum)
    for _ in range(3):
        mm()
    return 2 * 8192**3 / cuda_time(mm, 10)


def sec_ceilings() -> dict:
    copy, read = copy_bandwidth(), read_bandwidth()
    RESULTS["_bw"], RESULTS["_mm"] = max(copy, max(read.values()) * 1e12), _matmul_rate()
    out = {"copy_bw_TBps": copy / 1e12, "read_bw_TBps": read, "hbm_bw_TBps": RESULTS["_bw"] / 1e12,
           "bf16_matmul_TFLOPs": RESULTS["_mm"] / 1e12}
    try:
        RESULTS["_mm8"] = _fp8_matmul_rate()
        out["fp8_rowwise_matmul_TFLOPs"] = RESULTS["_mm8"] / 1e12
    except Exception as e:  # noqa: BLE001 - recorded: an older torch without row-wise scales
        out["fp8_matmul_error"] = repr(e)[:300]
    free()
    return out


def sec_matmul_rate() -> dict:
    """The bf16 matmul rate alone (what `prefill` compares with), when `ceilings` is too long for the call."""
    RESULTS["_mm"] = _matmul_rate()
    free()
    return {"bf16_matmul_TFLOPs": RESULTS["_mm"] / 1e12}


def sec_pytest() -> dict:
    """tests/test_fp8.py first (GPU-only tests that compare bits with torch), tests/test_flash_prefill.py, then
    tests/test_kernels.py, until --pytest-timeout (0: no limit); verbose, so a stopped run names the tests it ran."""
    env = dict(os.environ, RADIXFLOW_TOKENIZER=OPTS.tokenizer, PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "tests/test_fp8.py", "tests/test_flash_prefill.py",
           "tests/test_kernels.py"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=OPTS.pytest_timeout or None)
    except subprocess.TimeoutExpired as e:  # a bounded call: what ran is kept
        text = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        with open(os.path.join(OPTS.out, "pytest_gpu.log"), "w") as f:
            f.write(text)
        return {"rc": None, "summary": f"stopped after {OPTS.pytest_timeout} s", "tail": text[-500:]}
    with open(os.path.join(OPTS.out, "pytest_gpu.log"), "w") as f:
        f.write(out.stdout + out.stderr)
    return {"rc": out.returncode, "summary": out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-500:]}
