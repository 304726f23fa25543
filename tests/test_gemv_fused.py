"""The GEMV with RMSNorm or SiLU-and-mul in its prologue (kernels/gemv_fused.py) against the unfused
path: the standalone kernels' torch references, then the GEMV's. In Triton's interpreter at tiny shapes
without CUDA; with CUDA also at Llama-3-8B shapes (bf16 and FP8) and in a decoder layer."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from radixflow.kernels import reference as ref  # noqa: E402
from radixflow.kernels.fp8 import dequantize, quantize_rows_torch  # noqa: E402
from radixflow.kernels.gemv_fused import gemv_rmsnorm, gemv_silu_mul  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TINY = {"block_n": 16, "block_k": 32, "num_warps": 4, "stages": 3}
# several K tiles and a ragged N; two tiles a loop step; an FP8 words config (falls back to the plain kernel)
CONFIGS = [TINY, dict(TINY, unroll=2)]


def _unfused_norm(x, residual, norm_w, eps, w, b, w_scale=None):
    h, r = ref.rmsnorm_ref(x, norm_w, eps, residual)
    w_full = w if w_scale is None else dequantize(w, w_scale, torch.float32)
    return ref.gemv_ref(h.float(), w_full.float(), None if b is None else b.float()), r


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype,res_dtype", [(torch.float32, torch.float32), (torch.float16, torch.float32),
                                             (torch.float16, torch.float16)])
@pytest.mark.parametrize("config", CONFIGS)
def test_gemv_rmsnorm_matches_norm_then_gemv(m, bias, dtype, res_dtype, config):
    n, k = 40, 72
    x = torch.randn(m, k, device=DEV).to(dtype)
    residual = (3 * torch.randn(m, k, device=DEV)).to(res_dtype)
    norm_w = (1 + 0.5 * torch.randn(k, device=DEV)).to(dtype)
    w = (torch.randn(n, k, device=DEV) / k**0.5).to(dtype)
    b = torch.randn(n, device=DEV).to(dtype) if bias else None
    want, want_r = _unfused_norm(x, residual, norm_w, 1e-5, w, b)
    got, got_r = gemv_rmsnorm(x, residual, norm_w, 1e-5, w, b, config=config)
    assert got.dtype == dtype and got_r.dtype == res_dtype
    assert torch.equal(got_r, want_r)  # the updated residual: one rounding, as the standalone kernel's
    tol = 1e-4 if dtype == torch.float32 else 2e-2  # fp16: the unfused path rounds the normalised input
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("config", CONFIGS)
def test_gemv_silu_mul_matches_silu_mul_then_gemv(m, bias, config):
    n, inter = 40, 72
    gate_up = (2 * torch.randn(m, 2 * inter, device=DEV)).to(torch.float16)
    w = (torch.randn(n, inter, device=DEV) / inter**0.5).to(torch.float16)
    b = torch.randn(n, device=DEV).to(torch.float16) if bias else None
    act = ref.silu_and_mul_ref(gate_up)
    want = ref.gemv_ref(act.float(), w.float(), None if b is None else b.float())
    torch.testing.assert_close(gemv_silu_mul(gate_up, w, b, config=config).float(), want, rtol=2e-3, atol=2e-3)
    strided = torch.empty(m, 2 * inter + 8, device=DEV, dtype=gate_up.dtype)[:, :2 * inter]
    strided.copy_(gate_up)  # rows of a wider buffer: the row stride is honoured
    torch.testing.assert_close(gemv_silu_mul(strided, w, b, config=config).float(), want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("variant", [{}, {"unroll": 2}, {"words": True}])
def test_fp8_prologues_match_the_dequantized_reference(variant):
    m, n, k = 2, 40, 72
    config = dict(TINY, **variant)
    wq, ws = quantize_rows_torch(torch.randn(n, k, device=DEV))
    x = torch.randn(m, k, device=DEV).to(torch.float16)
    residual = torch.randn(m, k, device=DEV)
    norm_w = (1 + 0.5 * torch.randn(k, device=DEV)).to(torch.float16)
    want, _ = _unfused_norm(x, residual, norm_w, 1e-6, wq, None, ws)
    got, _ = gemv_rmsnorm(x, residual, norm_w, 1e-6, wq, config=config, w_scale=ws)
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=5e-2)
    wq2, ws2 = quantize_rows_torch(torch.randn(n, k // 2, device=DEV))
    act = ref.silu_and_mul_ref(x)
    want = ref.gemv_ref(act.float(), dequantize(wq2, ws2, torch.float32))
    torch.testing.assert_close(gemv_silu_mul(x, wq2, config=config, w_scale=ws2).float(), want, rtol=2e-2, atol=5e-2)


def test_bad_shapes_are_refused():
    x = torch.randn(1, 64, device=DEV)
    with pytest.raises(AssertionError):
        gemv_rmsnorm(x, torch.randn(1, 32, device=DEV), torch.ones(64, device=DEV), 1e-6, torch.randn(8, 64, device=DEV))
    with pytest.raises(AssertionError):
        gemv_silu_mul(torch.randn(9, 64, device=DEV), torch.randn(8, 32, device=DEV))  # 9 rows: not a GEMV batch


needs_cuda = pytest.mark.skipif(DEV != "cuda", reason="Llama-3-8B shapes: too slow for the CPU interpreter")


def _norm_then_linear_fp32(x, residual, norm_w, eps, w_full):
    """torch-native in float32: the yardstick both the fused and the unfused bf16 paths are held to."""
    r = x.float() + residual.float()
    h = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * norm_w.float()
    return h @ w_full.float().t(), r


@needs_cuda
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("n", [6144, 28672])  # qkv, gate_up
def test_gemv_rmsnorm_at_llama3_8b_shapes(fp8, n):
    from radixflow.kernels.gemv import GEMV_CONFIGS, GEMV_CONFIGS_FP8, gemv
    from radixflow.kernels.norm_act import rmsnorm

    k = 4096
    w = torch.randn(n, k, device=DEV) / k**0.5
    wq, ws = quantize_rows_torch(w) if fp8 else (w.to(torch.bfloat16), None)
    w_full = dequantize(wq, ws, torch.float32) if fp8 else wq.float()
    x = torch.randn(2, k, device=DEV).to(torch.bfloat16)
    residual = 4 * torch.randn(2, k, device=DEV)
    norm_w = (1 + 0.2 * torch.randn(k, device=DEV)).to(torch.bfloat16)
    want, want_r = _norm_then_linear_fp32(x, residual, norm_w, 1e-5, w_full)
    h, _ = rmsnorm(x, norm_w, 1e-5, residual)
    unfused_err = (gemv(h, wq, w_scale=ws).float() - want).abs().max().item()
    for config in GEMV_CONFIGS_FP8 if fp8 else GEMV_CONFIGS:
        for m in (1, 2):
            got, got_r = gemv_rmsnorm(x[:m], residual[:m], norm_w, 1e-5, wq, config=config, w_scale=ws)
            assert torch.equal(got_r, want_r[:m])
            err = (got.float() - want[:m]).abs().max().item()
            assert err <= max(2 * unfused_err, 0.02), (config, m, err, unfused_err)


@needs_cuda
@pytest.mark.parametrize("fp8", [False, True])
def test_gemv_silu_mul_at_llama3_8b_shapes(fp8):
    from radixflow.kernels.gemv import GEMV_CONFIGS, GEMV_CONFIGS_FP8, gemv
    from radixflow.kernels.norm_act import silu_and_mul

    inter, n = 14336, 4096
    w = torch.randn(n, inter, device=DEV) / inter**0.5
    wq, ws = quantize_rows_torch(w) if fp8 else (w.to(torch.bfloat16), None)
    gate_up = (2 * torch.randn(2, 2 * inter, device=DEV)).to(torch.bfloat16)
    unfused = gemv(silu_and_mul(gate_up), wq, w_scale=ws)
    for config in GEMV_CONFIGS_FP8 if fp8 else GEMV_CONFIGS:
        for m in (1, 2):
            got = gemv_silu_mul(gate_up[:m], wq, config=config, w_scale=ws)
            torch.testing.assert_close(got.float(), unfused[:m].float(), rtol=2e-2, atol=2e-2, msg=str(config))


@needs_cuda
def test_fused_chain_in_a_cuda_graph_with_pdl_matches_eager():
    """norm + gate_up-like, silu + down-like, norm + gate_up-like again: captured with PDL (the decode step's case, where a
    kernel's reads before its wait must touch only weights) against the same calls run eagerly without PDL."""
    from radixflow.kernels.gemv import capture_graph
    from radixflow.kernels.settings import KernelSettings

    k, inter = 4096, 2048
    w1 = (torch.randn(2 * inter, k, device=DEV) / k**0.5).to(torch.bfloat16)
    w2 = (torch.randn(k, inter, device=DEV) / inter**0.5).to(torch.bfloat16)
    norm_w = torch.ones(k, device=DEV, dtype=torch.bfloat16)
    x = torch.randn(1, k, device=DEV).to(torch.bfloat16)
    residual = torch.randn(1, k, device=DEV)
    outs = {}

    def chain(settings, key):
        gu, r = gemv_rmsnorm(x, residual, norm_w, 1e-5, w1, settings=settings)
        h = gemv_silu_mul(gu, w2, settings=settings)
        outs[key] = gemv_rmsnorm(h, r, norm_w, 1e-5, w1, settings=settings)

    chain(KernelSettings(pdl=False), "eager")
    graph = capture_graph(lambda i: chain(KernelSettings(), "graph"), 1)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(outs["eager"], outs["graph"]):
        assert torch.equal(a, b)


@needs_cuda
@pytest.mark.parametrize("prologue,n,k", [("rmsnorm", 6144, 4096), ("silu_mul", 4096, 14336)])
def test_gpu_chooser_keeps_a_candidate_or_nothing(prologue, n, k):
    from radixflow.kernels.gemv import GEMV_CONFIG, GEMV_CONFIGS
    from radixflow.kernels.gemv_fused import choose_prologue
    from radixflow.kernels.settings import KernelSettings

    layers = [((torch.randn(n, k, device=DEV) / k**0.5).to(torch.bfloat16), None) for _ in range(2)]
    report = {}
    chosen = choose_prologue(layers, prologue, GEMV_CONFIG, KernelSettings(), report)
    assert set(report) == {"unfused", *map(str, GEMV_CONFIGS)} and all(0 < t < 1e4 for t in report.values())
    if chosen is None:
        assert min(report.values()) == report["unfused"]
    else:
        assert chosen in GEMV_CONFIGS and report[str(chosen)] == min(report.values())


@needs_cuda
def test_gpu_engine_decodes_the_same_with_and_without_prologues(monkeypatch):
    """A float32 engine with every GEMV layer forced onto the fused path, CUDA graphs captured under each setting:
    the same greedy tokens and logprobs as without, and the fused kernels were captured."""
    import dataclasses

    import radixflow
    import radixflow.kernels.gemv_fused as fused_module
    from radixflow.kernels.gemv import GEMV_CONFIG
    from radixflow.model_files import resolve_model

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tok = os.environ.get("RADIXFLOW_TOKENIZER") or resolve_model(None).path
    engine = radixflow.Engine(os.path.join(root, "benchmarks", "configs", "smollm2-135m.json"), load_format="dummy",
                              dtype="float32", tokenizer_path=tok, max_total_tokens=4096, cuda_graph_max_bs=4)
    runner = engine.runner
    for m in runner.model.modules():
        if getattr(m, "prologue", ""):
            m.gemv_max_m, m.gemv_config, m.prologue_config = 4, GEMV_CONFIG, GEMV_CONFIG
    calls = []
    for name in ("gemv_rmsnorm", "gemv_silu_mul"):
        fn = getattr(fused_module, name)
        monkeypatch.setattr(fused_module, name, lambda *a, _fn=fn, _n=name, **kw: calls.append(_n) or _fn(*a, **kw))
    prompts = [[(7 * i + j) % 49000 + 3 for j in range(5 + 3 * i)] for i in range(3)]
    params = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}
    outs = []
    for on in (True, False):
        runner.set_kernel_settings(dataclasses.replace(runner.settings, gemv_prologue=on), graph_max_bs=4)
        res = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
        outs.append([[(t, lp) for lp, t, _ in r["meta_info"]["output_token_logprobs"]] for r in res])
        if on:
            assert "gemv_rmsnorm" in calls and "gemv_silu_mul" in calls
            calls.clear()
    assert calls == []  # off: none captured
    engine.shutdown()
    for a, b in zip(*outs):
        assert [t for t, _ in a] == [t for t, _ in b]
        assert max(abs(x - y) for (_, x), (_, y) in zip(a, b)) < 1e-3


def test_the_server_flag_sets_the_kernel_setting_off_by_default():
    from radixflow.runtime.server_args import ServerArgs

    assert ServerArgs().kernel_settings().gemv_prologue is False
    assert ServerArgs(enable_gemv_prologue=True).kernel_settings().gemv_prologue is True
