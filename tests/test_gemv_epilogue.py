"""kernels/gemv_epilogue.py against the unfused kernels' references (interpreter on CPU, tiny shapes), and the
norm fold / gate_up interleave of runtime/execution/layers/norm_fold.py."""

from __future__ import annotations

import os
import random

import pytest
import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

from radixflow.kernels import reference as ref  # noqa: E402
from radixflow.kernels.gemv import GEMV_CONFIGS_FP8, gemv  # noqa: E402
from radixflow.kernels.gemv_epilogue import gemv_residual, gemv_rstd  # noqa: E402
from radixflow.kernels.norm_act import silu_and_mul  # noqa: E402
from radixflow.kernels.reference import quantize_rows_torch  # noqa: E402
from radixflow.runtime.execution.layers.norm_fold import deinterleave_rows, interleave_rows  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TINY = {"block_n": 8, "block_k": 32, "num_warps": 4, "stages": 3}  # several K tiles, ragged N
EPS = 1e-5


def _close(a: torch.Tensor, b: torch.Tensor, tol: float) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    err = (a.float() - b.float()).abs().max().item()
    assert err <= tol, err


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("config", [TINY, dict(TINY, unroll=2)])
def test_rstd_epilogue_is_the_norm_then_the_gemv(m, dtype, bias, config):
    k, n = 96, 44
    res = torch.randn(m, k, device=DEV) * 3
    g = torch.rand(k, device=DEV).to(dtype) + 0.5
    w = torch.randn(n, k, device=DEV).to(dtype)
    b = torch.randn(n, device=DEV).to(dtype) if bias else None
    want = ref.gemv_ref(ref.rmsnorm_ref(res.to(dtype), g, EPS), w, b)  # unfused: norm (weight g), then the GEMV
    folded = (w.float() * g.float()).to(dtype)
    sums = (res.to(dtype).float() ** 2).sum(-1)
    got = gemv_rstd(res.to(dtype), folded, sums, EPS, bias=b, config=config)
    # bf16: two roundings in other places (x instead of norm(x), W * g instead of norm(x) * g): ~2 ulps
    _close(got, want, 1e-4 if dtype == torch.float32 else 2e-2 * want.abs().max().item())


@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_epilogue_pairs_interleaved_rows(m, dtype):
    k, inter = 64, 20  # 40 rows: the last program holds 4 of its 8
    res = torch.randn(m, k, device=DEV)
    w = torch.randn(2 * inter, k, device=DEV).to(dtype)
    sums = (res.to(dtype).float() ** 2).sum(-1)
    gate_up = gemv_rstd(res.to(dtype), w, sums, EPS, config=TINY)
    want = silu_and_mul(gate_up)  # the unfused kernel (its rounding; torch's bf16 silu can differ by an ulp)
    got = gemv_rstd(res.to(dtype), interleave_rows(w, 2), sums, EPS, silu=True, config=TINY)
    _close(got, want, 1e-5 * want.abs().max().item())
    _close(silu_and_mul(interleave_rows(gate_up.T, 2).T.contiguous(), interleaved=True), want, 0.0)


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("res_dtype", [torch.float32, torch.bfloat16])
def test_residual_epilogue_adds_stores_and_sums(m, res_dtype):
    k, n = 80, 36
    x = torch.randn(m, k, device=DEV).to(torch.bfloat16)
    w = torch.randn(n, k, device=DEV).to(torch.bfloat16)
    res = (torch.randn(m, n, device=DEV) * 4).to(res_dtype)
    # the plain GEMV (the same sums in the same order), then the add as the norm kernel does it
    _, want_res = ref.rmsnorm_ref(gemv(x, w, config=TINY), torch.ones(n, device=DEV), EPS, res)
    sums = torch.full((m + 2,), 1.5, device=DEV)  # the kernel stores over what is there; rows past M untouched
    ticket = torch.zeros(1, dtype=torch.int32, device=DEV)
    got_res, got_x = gemv_residual(x, w, res, sums, ticket, config=TINY)
    # an ulp apart at most where bf16 is stored (Triton's interpreter rounds float32 to bf16 its own way)
    ulp = 2**-7 * want_res.abs().max().item()
    _close(got_res, want_res, 0.0 if res_dtype == torch.float32 else ulp)
    _close(got_x, want_res.to(torch.bfloat16), ulp)
    want_sums = (got_res.float() ** 2).sum(-1)  # of the stream as stored
    _close(sums[:m], want_sums, 1e-5 * want_sums.max().item())
    assert torch.equal(sums[m:], torch.full((2,), 1.5, device=DEV))
    assert ticket.item() == 0  # left ready for the next use


def _run_grid_in_order(monkeypatch, order) -> None:
    """Make Triton's interpreter run a launch's programs in `order(n)` (a list of 0..n-1) instead of 0, 1, ..."""
    import builtins
    import sys

    from triton.runtime import interpreter

    def grid_range(*args):
        r = builtins.range(*args)
        return order(len(r)) if sys._getframe(1).f_code.co_name == "__call__" and len(r) > 1 else r

    monkeypatch.setattr(interpreter, "range", grid_range, raising=False)


def _fixed_order_sums(h: torch.Tensor, block_n: int) -> np.ndarray:
    """The sums as `_row_sums` adds them: per program its columns' squares (a row at a time), then the programs'
    partials in program order, padded to a power of two, as float32 numpy (the interpreter's tl.sum)."""
    hf = h.float().numpy()
    programs = -(-hf.shape[1] // block_n)
    parts = np.zeros((triton.next_power_of_2(programs), hf.shape[0]), dtype=np.float32)
    for p in range(programs):
        blk = hf[:, p * block_n:(p + 1) * block_n]
        parts[p] = np.sum(blk * blk, axis=1)
    return np.sum(parts, axis=0)


@pytest.mark.skipif(DEV == "cuda", reason="reorders the interpreter's programs")
@pytest.mark.parametrize("m", [1, 3])
def test_residual_sums_do_not_depend_on_the_programs_order(m, monkeypatch):
    """P1.2 of session 11's review: float atomics made the sums (so rstd, so decode) vary run to run."""
    k, n = 32, 96  # 12 programs of 8 columns
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    res = torch.randn(m, n, generator=gen) * 10 ** torch.randint(-3, 4, (m, n), generator=gen)  # orders matter

    def sums_in(order):
        _run_grid_in_order(monkeypatch, order)
        sums, ticket = torch.empty(m), torch.zeros(1, dtype=torch.int32)
        h, _ = gemv_residual(x, w, res, sums, ticket, config=TINY)
        assert ticket.item() == 0
        return h, sums

    h, first = sums_in(lambda n: list(range(n)))
    assert np.array_equal(first.numpy(), _fixed_order_sums(h, TINY["block_n"])[:m])
    for order in (lambda n: list(reversed(range(n))), lambda n: random.Random(n).sample(range(n), n)):
        h2, again = sums_in(order)
        assert torch.equal(h2, h) and torch.equal(again.view(torch.int32), first.view(torch.int32))
    # the old way, float adds in the programs' order, does differ here: the test can tell
    hf = h.float()
    parts = [(hf[:, p:p + 8] ** 2).sum(-1) for p in range(0, n, 8)]
    fwd, back = torch.zeros(m), torch.zeros(m)
    for part in parts:
        fwd += part
    for part in reversed(parts):
        back += part
    assert not torch.equal(fwd, back)


def test_fp8_weights_take_their_row_scales():
    k, n = 64, 24
    res = torch.randn(2, k, device=DEV).to(torch.bfloat16)
    wq, scale = quantize_rows_torch(torch.randn(n, k, device=DEV))
    sums = (res.float() ** 2).sum(-1)
    deq = (wq.float() * scale.view(-1, 1)).to(torch.bfloat16)
    want = gemv_rstd(res, deq, sums, EPS, config=TINY)
    tol = 2e-2 * want.abs().max().item()  # the bf16 copy of the weights rounds W * scale
    _close(gemv_rstd(res, wq, sums, EPS, w_scale=scale, config=TINY), want, tol)
    words = dict(TINY, words=True)  # a words config falls back to the first FP8 config
    _close(gemv_rstd(res, wq, sums, EPS, w_scale=scale, config=words), want, tol)


def test_interleave_round_trip():
    w = torch.arange(24.0).view(6, 4)
    inter = interleave_rows(w, 2)
    assert torch.equal(inter[0], w[0]) and torch.equal(inter[1], w[3]) and torch.equal(inter[2], w[1])
    assert torch.equal(deinterleave_rows(inter, 2), w)


# -- the model: logits with the fold and the epilogues against the unfolded model ---------------------------
class _MixHeads:
    """An attention stand-in that mixes q, k and v per head (rotary and the KV cache left out): what flows into
    o_proj depends on all of qkv's outputs."""

    def forward_rotary(self, positions, q, k, v, rotary, layer_id, fb):
        group = q.shape[1] // k.shape[1]
        return q * k.repeat_interleave(group, 1) + v.repeat_interleave(group, 1)


def _tiny_model(bias: bool):
    from transformers import LlamaConfig

    from radixflow.runtime.execution.models.llama import LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, tie_word_embeddings=True,
                      attention_bias=bias, mlp_bias=bias)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg, 64).to(DEV)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.rand_like(p) + 0.5 if "norm" in name else torch.randn_like(p) * 0.3)
    return model


def _decode_batch(rows: int):
    from radixflow.runtime.execution.forward_batch import ForwardBatch, ForwardMode

    ids = torch.arange(rows, device=DEV) * 7 % 96
    z = torch.zeros(rows, dtype=torch.int64, device=DEV)
    return ForwardBatch(ForwardMode.DECODE, ids, ids + 3, z, z, z + 4, z + 3, z + 1, torch.arange(rows, device=DEV))


@pytest.mark.parametrize("bias", [False, True])
def test_folded_model_logits_match_the_unfolded(bias):
    import copy

    from radixflow.kernels.settings import KernelSettings
    from radixflow.runtime.execution.layers.parallel_linear import ColumnParallelLinear, RowParallelLinear
    from radixflow.runtime.execution.models import llama_epilogue

    model, fb, backend = _tiny_model(bias), _decode_batch(3), _MixHeads()
    want = model.compute_logits(model(fb, backend))
    folded = copy.deepcopy(model)
    folded.fold_norms()
    assert all(torch.equal(n.weight, torch.ones_like(n.weight)) for n in (folded.layers[1].input_layernorm,))
    folded.set_kernel_settings(KernelSettings(), fused=True)
    tol = 1e-4 * want.abs().max().item()
    _close(folded.compute_logits(folded(fb, backend)), want, tol)  # the GEMM path: norms of weight ones, torch's SiLU
    linears = [m for m in folded.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    for m in linears:
        m.gemv_max_m, m.gemv_config = 8, TINY
    assert llama_epilogue.takes_epilogues(folded, fb)
    _close(folded.compute_logits(folded(fb, backend)), want, tol)  # the epilogues
    folded.set_kernel_settings(KernelSettings(gemv_epilogue=False), fused=True)
    assert not llama_epilogue.takes_epilogues(folded, fb)  # the switch, after load: the folded model's plain GEMVs
    _close(folded.compute_logits(folded(fb, backend)), want, tol)
    folded.set_kernel_settings(KernelSettings(), fused=True)
    linears[0].gemv_max_m = 2
    assert not llama_epilogue.takes_epilogues(folded, fb)  # 3 rows: qkv on cuBLAS, so no epilogue pass


def test_where_the_fold_applies():
    from radixflow.kernels.settings import KernelSettings
    from radixflow.runtime.execution.attention.flashinfer_backend import FlashInferBackend
    from radixflow.runtime.execution.attention.torch_native import TorchNativeBackend
    from radixflow.runtime.execution.attention.triton_backend import TritonBackend
    from radixflow.runtime.execution.layers.norm_fold import fold_off_reason, settings_off_reason
    from radixflow.runtime.server_args import ServerArgs

    on = KernelSettings()
    assert fold_off_reason(on, "cuda", 1, TritonBackend, False) is None
    assert "CUDA" in fold_off_reason(on, "cpu", 1, TritonBackend, False)
    assert "tensor parallel" in fold_off_reason(on, "cuda", 2, TritonBackend, False)
    assert "torch-native" in fold_off_reason(on, "cuda", 1, TorchNativeBackend, False)
    assert "torch-native" in fold_off_reason(KernelSettings(fused_kernels=False), "cuda", 1, TritonBackend, False)
    assert "FlashInferBackend" in fold_off_reason(on, "cuda", 1, FlashInferBackend, False)  # untested there
    assert "pre-quantized" in fold_off_reason(on, "cuda", 1, TritonBackend, True)
    assert "biases" in fold_off_reason(on, "cuda", 1, TritonBackend, False, biased=True)
    assert "deterministic" in fold_off_reason(KernelSettings(batch_invariant=True), "cuda", 1, TritonBackend, False)
    off = ServerArgs(disable_gemv_epilogue=True).kernel_settings()
    assert fold_off_reason(off, "cuda", 1, TritonBackend, False) == "--disable-gemv-epilogue"
    # the model's switch is the same rule's settings part
    assert settings_off_reason(on, True) is None and settings_off_reason(off, True) == "--disable-gemv-epilogue"
    assert settings_off_reason(on, False) is not None


def test_a_folded_model_refuses_a_second_fold_and_checkpoint_weights():
    model = _tiny_model(False)
    model.fold_norms()
    with pytest.raises(AssertionError, match="already folded"):
        model.fold_norms()
    with pytest.raises(AssertionError, match="folded model"):
        model.load_weights(iter(()))


def test_a_cpu_engine_does_not_fold(caplog):
    import logging
    from pathlib import Path

    from radixflow.runtime.execution.model_runner import ModelRunner
    from radixflow.runtime.server_args import ServerArgs

    tiny = str(Path(__file__).resolve().parents[1] / "benchmarks" / "configs" / "smollm2-tiny.json")
    with caplog.at_level(logging.INFO, logger="radixflow.runtime.execution.model_runner"):
        r = ModelRunner(ServerArgs(model_path=tiny, tokenizer_path=os.environ.get("RADIXFLOW_TOKENIZER"),
                                   load_format="dummy", device="cpu", dtype="float32", max_total_tokens=1024,
                                   max_running_requests=4))
    assert not r.model.folded and not r.model.layers[0].mlp.interleaved
    assert "norm weights not folded, no GEMV epilogues: not CUDA" in caplog.text


# -- GPU: Llama-3-8B shapes at every config, and a PDL chain in a CUDA graph ---------------------------------
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@gpu
@needs_cuda
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("kind", ["rstd", "silu", "residual"])
def test_gpu_llama_shapes_every_config(fp8, kind):
    from radixflow.kernels.gemv import GEMV_CONFIGS

    configs = GEMV_CONFIGS_FP8 if fp8 else GEMV_CONFIGS
    shapes = {"rstd": [(6144, 4096)], "silu": [(28672, 4096)], "residual": [(4096, 4096), (4096, 14336)]}[kind]
    for n, k in shapes:
        w32 = torch.randn(n, k, device=DEV) * k**-0.5
        wq, scale = quantize_rows_torch(w32) if fp8 else (w32.to(torch.bfloat16), None)
        wf = wq.float() * (1 if scale is None else scale.view(-1, 1))
        for m in (1, 3):  # BLOCK_M 1 and 4
            x = torch.randn(m, k, device=DEV).to(torch.bfloat16) * 4
            sums = (x.float() ** 2).sum(-1)
            dot = x.float() @ wf.T
            for cfg in configs:
                if kind == "residual":
                    res = torch.randn(m, n, device=DEV)
                    s, ticket = torch.empty(m, device=DEV), torch.zeros(1, dtype=torch.int32, device=DEV)
                    got_res, got_x = gemv_residual(x, wq, res, s, ticket, w_scale=scale, config=cfg)
                    assert ticket.item() == 0
                    _close(got_res, dot + res, 0.1)  # o rounded to bf16 first
                    _close(s, (got_res**2).sum(-1), 1e-4 * s.max().item())
                    continue
                want = dot * torch.rsqrt(sums / k + EPS)[:, None]
                if kind == "silu":  # rows [gate; up], interleaved for the kernel
                    gate, up = want.chunk(2, dim=-1)
                    want = torch.nn.functional.silu(gate) * up
                    w_in = interleave_rows(wq.view(torch.uint8), 2).view(wq.dtype)
                    s_in = None if scale is None else interleave_rows(scale, 2)
                    got = gemv_rstd(x, w_in, sums, EPS, silu=True, w_scale=s_in, config=cfg)
                    _close(got, want.to(torch.bfloat16), 0.03 * want.abs().max().item())
                    continue
                _close(gemv_rstd(x, wq, sums, EPS, w_scale=scale, config=cfg), want.to(torch.bfloat16),
                       0.02 * want.abs().max().item())


@gpu
@needs_cuda
def test_gpu_pdl_chain_in_a_graph_matches_eager():
    """o_proj -> gate_up -> down -> qkv as a decode layer chains them, with PDL, captured and replayed: each sum
    must be stored when the next kernel reads it, the tickets must be back at 0 for the next replay, and the bits
    must not change between replays or against eager (the sums add in a fixed order). Against a float32 torch
    reference of the four steps too: an ordering error would show in the graph and eager runs alike."""
    h, inter = 4096, 14336
    ws = [(torch.randn(n, k, device=DEV) * k**-0.5).to(torch.bfloat16) for n, k in ((h, h), (2 * inter, h), (h, inter), (6144, h))]
    attn = torch.randn(1, h, device=DEV).to(torch.bfloat16)
    res0 = torch.randn(1, h, device=DEV) * 3

    def chain():
        sums = torch.empty(2, 1, device=DEV)
        tickets = torch.zeros(2, dtype=torch.int32, device=DEV)
        res, x = gemv_residual(attn, ws[0], res0, sums[0], tickets[0])
        act = gemv_rstd(x, ws[1], sums[0], EPS, silu=True)
        res, x = gemv_residual(act, ws[2], res, sums[1], tickets[1])
        return gemv_rstd(x, ws[3], sums[1], EPS), res

    def reference():
        res = (attn.float() @ ws[0].float().T).to(torch.bfloat16).float() + res0
        gu = (res.to(torch.bfloat16).float() @ ws[1].float().T) * torch.rsqrt((res**2).mean(-1, keepdim=True) + EPS)
        act = (torch.nn.functional.silu(gu[:, 0::2]) * gu[:, 1::2]).to(torch.bfloat16).float()
        res = (act @ ws[2].float().T).to(torch.bfloat16).float() + res
        q = (res.to(torch.bfloat16).float() @ ws[3].float().T) * torch.rsqrt((res**2).mean(-1, keepdim=True) + EPS)
        return q, res

    eager = chain()
    want = reference()
    _close(eager[1], want[1], 1e-2 * want[1].abs().max().item())
    _close(eager[0].float(), want[0], 0.02 * want[0].abs().max().item())
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        chain()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = chain()
    for _ in range(5):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out[1], eager[1]) and torch.equal(out[0], eager[0])
