"""Every Triton kernel against its torch reference.

Without CUDA the kernels run in Triton's interpreter on CPU tensors at tiny shapes
(TRITON_INTERPRET must be set before the kernels' modules are imported, so it is set
here, at the top). With CUDA the same tests run on the GPU, and the `gpu`-marked
tests add real shapes (Llama-3-8B heads, long contexts, bf16) and CUDA graphs.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from radixflow.kernels import reference as ref  # noqa: E402
from radixflow.kernels import cpu_linear  # noqa: E402
from radixflow.kernels.argmax import argmax_rows  # noqa: E402
from radixflow.kernels.bitmask import apply_token_bitmask, apply_token_bitmask_torch  # noqa: E402
from radixflow.kernels.bitmask_triton import apply_token_bitmask_triton  # noqa: E402
from radixflow.kernels.decode_attention import decode_attention, num_kv_splits  # noqa: E402
from radixflow.kernels.extend_attention import extend_attention  # noqa: E402
from radixflow.kernels.gemv import GEMV_CONFIGS, choose_gemv, gemv  # noqa: E402
from radixflow.kernels.kv_store import store_kv  # noqa: E402
from radixflow.kernels.matmul import SMALL_M, TINY_M, matmul_batch_invariant  # noqa: E402
from radixflow.kernels.norm_act import rmsnorm, silu_and_mul  # noqa: E402
from radixflow.kernels.rotary import apply_rotary, apply_rotary_store_kv  # noqa: E402
from radixflow.kernels.sampling import sample_rows  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _close(a: torch.Tensor, b: torch.Tensor, tol: float) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    assert not torch.isnan(a).any()
    err = (a.float() - b.float()).abs().max().item()
    assert err <= tol, f"max abs error {err} > {tol}"


# -- small fixtures -----------------------------------------------------------------------------
def _tokenizer_dir() -> str:
    """The default model's tokenizer; RADIXFLOW_TOKENIZER where that model is not installed."""
    if os.environ.get("RADIXFLOW_TOKENIZER"):
        return os.environ["RADIXFLOW_TOKENIZER"]
    from radixflow.model_files import resolve_model

    return resolve_model(None).path


def _rope_tables(max_pos: int, dim: int, device: str = DEV) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    freqs = torch.outer(torch.arange(max_pos).float(), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(device), emb.sin().to(device)


def _paged_pool(seq_lens: list, kv_heads: int, dim: int, dtype, device: str = DEV, rows: int = 8):
    """A pool with scattered slots: request b owns a random set of slots in row b + 1."""
    total = sum(seq_lens) + 16
    k_buf = torch.randn(total, kv_heads, dim, device=device).to(dtype)
    v_buf = torch.randn(total, kv_heads, dim, device=device).to(dtype)
    table = torch.zeros(rows, max(seq_lens) + 4, dtype=torch.int32, device=device)
    perm = (torch.randperm(total - 1) + 1).to(device)
    start = 0
    for b, n in enumerate(seq_lens):
        table[b + 1, :n] = perm[start : start + n].int()
        start += n
    req_idx = torch.arange(1, len(seq_lens) + 1, device=device)
    return k_buf, v_buf, table, req_idx


# -- elementwise kernels ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rmsnorm_matches_reference(dtype):
    x = torch.randn(5, 48, device=DEV).to(dtype)
    r = torch.randn(5, 48, device=DEV).to(dtype)
    w = torch.randn(48, device=DEV).to(dtype)
    _close(rmsnorm(x, w, 1e-5), ref.rmsnorm_ref(x, w, 1e-5), 1e-5 if dtype == torch.float32 else 2e-3)
    out, res = rmsnorm(x, w, 1e-5, r)
    ref_out, ref_res = ref.rmsnorm_ref(x, w, 1e-5, r)
    assert torch.equal(res, ref_res)
    _close(out, ref_out, 1e-5 if dtype == torch.float32 else 2e-3)


def test_rmsnorm_keeps_a_float32_residual_stream():
    """A 16-bit model's residual stream is float32: the sum keeps float32, the output x's dtype."""
    x = torch.randn(5, 48, device=DEV).to(torch.float16)
    r = 30 * torch.randn(5, 48, device=DEV)  # large, as late in a deep model: a 16-bit sum would round
    w = torch.randn(48, device=DEV).to(torch.float16)
    out, res = rmsnorm(x, w, 1e-5, r)
    ref_out, ref_res = ref.rmsnorm_ref(x, w, 1e-5, r)
    assert res.dtype == torch.float32 and out.dtype == torch.float16
    _close(res, x.float() + r, 1e-6)
    assert not torch.equal(res, (x + r.half()).float())  # the 16-bit stream would differ
    _close(res, ref_res, 1e-6)
    _close(out, ref_out, 2e-3)


def test_rmsnorm_reference_is_the_layer():
    from radixflow.runtime.execution.layers.norm import RMSNorm

    layer = RMSNorm(32, 1e-6)
    with torch.no_grad():
        layer.weight.normal_()
    x, r = torch.randn(4, 32), torch.randn(4, 32)
    assert torch.equal(layer(x), ref.rmsnorm_ref(x, layer.weight, 1e-6))
    out, res = layer(x, r)
    ref_out, ref_res = ref.rmsnorm_ref(x, layer.weight, 1e-6, r)
    assert torch.equal(out, ref_out) and torch.equal(res, ref_res)
    layer16, x16 = layer.to(torch.bfloat16), x.to(torch.bfloat16)
    for stream in (30 * r, (30 * r).to(torch.bfloat16)):  # a bf16 model's float32 stream; a bf16 one
        out, res = layer16(x16, stream)
        ref_out, ref_res = ref.rmsnorm_ref(x16, layer16.weight, 1e-6, stream)
        assert res.dtype == stream.dtype and out.dtype == torch.bfloat16
        assert torch.equal(out, ref_out) and torch.equal(res, ref_res)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_silu_and_mul_matches_reference(dtype):
    x = (3 * torch.randn(6, 80, device=DEV)).to(dtype)
    _close(silu_and_mul(x), ref.silu_and_mul_ref(x), 1e-5 if dtype == torch.float32 else 2e-3)


@pytest.mark.parametrize("n", [80, 2100])  # one masked block; two blocks along the row, the second masked
def test_silu_and_mul_over_interleaved_rows_equals_the_plain_layout(n):
    """The fold's layout (gate i, up i side by side, one contiguous load split in registers) gives the same bits
    as the plain [gate; up] rows: a wrong split (gate and up swapped, pairs misaligned) would differ."""
    x = (3 * torch.randn(3, 2 * n, device=DEV)).to(torch.bfloat16)
    gate, up = x.chunk(2, dim=-1)
    pairs = torch.stack([gate, up], dim=-1).reshape(3, 2 * n)
    assert torch.equal(silu_and_mul(pairs, interleaved=True), silu_and_mul(x))


def test_rotary_in_place_on_fused_qkv_views():
    hq, hk, d = 3, 2, 16
    cos, sin = _rope_tables(32, d)
    qkv = torch.randn(6, (hq + 2 * hk) * d, device=DEV)
    q = qkv[:, : hq * d].view(6, hq, d)
    k = qkv[:, hq * d : (hq + hk) * d].view(6, hk, d)
    v_before = qkv[:, (hq + hk) * d :].clone()
    pos = torch.tensor([0, 3, 5, 31, 2, 2], device=DEV)
    want_q, want_k = ref.rotary_ref(pos, q.clone(), k.clone(), cos, sin)
    got_q, got_k = apply_rotary(pos, q, k, cos, sin)
    assert got_q.data_ptr() == q.data_ptr()  # in place
    _close(got_q, want_q, 1e-5)
    _close(got_k, want_k, 1e-5)
    assert torch.equal(qkv[:, (hq + hk) * d :], v_before)  # v untouched


def test_rotary_reference_is_the_layer():
    from types import SimpleNamespace

    from radixflow.runtime.execution.layers.rotary import RotaryEmbedding

    layer = RotaryEmbedding(SimpleNamespace(rope_theta=10000.0), 16, 64)
    pos = torch.tensor([0, 7, 63])
    q, k = torch.randn(3, 4, 16), torch.randn(3, 2, 16)
    got = layer(pos, q, k)
    want = ref.rotary_ref(pos, q, k, layer.cos, layer.sin)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_rotary_layer_regathers_after_new_pass():
    """The layer keeps one pass's cos/sin rows for all its layers, keyed by the positions tensor.
    A buffer refilled in place (a CUDA graph's, between its warm-up and its capture) keeps the
    key, so each pass must start with new_pass(), which the model's forward calls."""
    from types import SimpleNamespace

    from radixflow.runtime.execution.layers.rotary import RotaryEmbedding

    layer = RotaryEmbedding(SimpleNamespace(rope_theta=10000.0), 16, 64)
    pos = torch.tensor([0, 7, 63])
    q, k = torch.randn(3, 4, 16), torch.randn(3, 2, 16)
    layer(pos, q, k)
    pos.copy_(torch.tensor([5, 6, 9]))
    want = ref.rotary_ref(pos, q, k, layer.cos, layer.sin)
    stale = layer(pos, q, k)
    assert not torch.equal(stale[0], want[0])  # the hazard new_pass exists for
    layer.new_pass()
    got = layer(pos, q, k)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_store_kv_writes_exactly_the_slots():
    k_buf = torch.randn(20, 2, 16, device=DEV)
    v_buf = torch.randn(20, 2, 16, device=DEV)
    kv = torch.randn(3, 4, 16, device=DEV)
    k, v = kv[:, :2], kv[:, 2:]  # strided views, like the fused qkv output
    loc = torch.tensor([5, 9, 1], device=DEV)
    want_k, want_v = k_buf.clone(), v_buf.clone()
    ref.store_kv_ref(want_k, want_v, loc, k, v)
    store_kv(k_buf, v_buf, loc, k, v)
    assert torch.equal(k_buf, want_k) and torch.equal(v_buf, want_v)


def _split_qkv(qkv: torch.Tensor, hq: int, hk: int, d: int):
    """q, k, v as strided views of one [T, (Hq + 2 Hkv) * D] tensor, like the qkv projection's output."""
    t = qkv.shape[0]
    q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    return q.view(t, hq, d), k.view(t, hk, d), v.view(t, hk, d)


def _rotary_store_both_ways(t, hq, hk, d, dtype, max_pos=32, slots=20):
    """(fused kernel, reference) results: the qkv tensor rotated in place and the two pool buffers."""
    cos, sin = _rope_tables(max_pos, d)
    qkv = torch.randn(t, (hq + 2 * hk) * d, device=DEV).to(dtype)
    k_buf = torch.randn(slots, hk, d, device=DEV).to(dtype)
    v_buf = torch.randn(slots, hk, d, device=DEV).to(dtype)
    pos = torch.randint(0, max_pos, (t,), device=DEV)
    loc = torch.randperm(slots, device=DEV)[:t]
    want_qkv, want_k, want_v = qkv.clone(), k_buf.clone(), v_buf.clone()
    ref.rotary_store_kv_ref(pos, *_split_qkv(want_qkv, hq, hk, d), cos, sin, want_k, want_v, loc)
    q, k, v = _split_qkv(qkv, hq, hk, d)
    got_q, _ = apply_rotary_store_kv(pos, q, k, v, cos, sin, k_buf, v_buf, loc)
    assert got_q.data_ptr() == q.data_ptr()  # in place
    return (qkv, k_buf, v_buf), (want_qkv, want_k, want_v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rotary_store_kv_matches_reference(dtype):
    (qkv, k_buf, v_buf), (want_qkv, want_k, want_v) = _rotary_store_both_ways(5, 3, 2, 16, dtype)
    # the GPU may contract x1*c - x2*s into one FMA: equal up to the last bit, not bitwise
    torch.testing.assert_close(qkv, want_qkv, rtol=2e-6 if dtype == torch.float32 else 1e-3, atol=1e-6)  # in place
    torch.testing.assert_close(k_buf, want_k, rtol=2e-6 if dtype == torch.float32 else 1e-3, atol=1e-6)
    assert torch.equal(v_buf, want_v)  # v copied unchanged, only into the slots


# -- sampling without a sort -----------------------------------------------------------------------
def _allowed_distribution(row: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """What runtime/scheduling/sampler.py's torch path draws from: softmax, top-k / top-p by sorting, min-p."""
    from radixflow.runtime.scheduling.sampler import _top_k_top_p

    probs = _top_k_top_p(torch.softmax(row.float() / temperature, dim=-1)[None], [top_k], [top_p])[0]
    probs = probs.masked_fill(probs < min_p * probs.max(), 0.0)
    return probs / probs.sum()


def _draw_many(row: torch.Tensor, n: int, temperature: float, top_k: int, top_p: float, min_p: float, block: int):
    rounds = torch.zeros(n, dtype=torch.int32, device=row.device)
    ids = sample_rows(row.repeat(n, 1).contiguous(), [temperature] * n, [top_k] * n, [top_p] * n, [min_p] * n,
                      block=block, rounds=rounds)
    return ids, rounds


def _check_draws(row, n, params, block, tv_max):
    torch.manual_seed(1)  # the kernel's seed comes from torch's CPU generator: a fixed draw
    ids, rounds = _draw_many(row, n, *params, block=block)
    want = _allowed_distribution(row, *params)
    got = torch.bincount(ids, minlength=row.numel()).float() / n
    assert (got[want == 0] == 0).all(), "drew a token outside top-k / top-p / min-p"
    tv = 0.5 * (got - want).abs().sum().item()
    assert tv < tv_max, f"total variation {tv:.3f} from the sort-based distribution"
    assert rounds.min() >= 1


@pytest.mark.parametrize("params", [(0.9, 40, 0.3, 0.0), (0.9, 5, 1.0, 0.0), (0.9, 40, 1.0, 0.3), (0.3, 40, 1.0, 0.0)],
                         ids=["top_p", "top_k", "min_p", "temperature"])
def test_sampling_kernel_draws_from_the_truncated_distribution(params):
    """Rejection sampling from the row must match the sort-based torch path's distribution, with
    each cut (top-p, top-k, min-p) the one that binds, or none (temperature alone)."""
    torch.manual_seed(0)
    row = torch.linspace(3, -3, 40)[torch.randperm(40)].to(DEV)  # value order != index order
    allowed = int((_allowed_distribution(row, *params) > 0).sum())
    assert 1 < allowed and (allowed < 40) == (params[1:] != (40, 1.0, 0.0))  # the cut binds, if any
    _check_draws(row, 300, params, block=16, tv_max=0.12)  # 3 chunks, padded to 4


def test_sampling_kernel_redraws_from_the_tokens_above_a_rejected_one():
    """After a rejection the next draw must come from the tokens above the rejected one. Chunk 0
    holds A (p 0.3); chunk 1 holds B (p 0.2) and 14 equal small tokens (0.5 together), which top-p
    0.35 drops. The allowed set {A, B} gives A 0.6. Redrawing a chunk by the masses before the
    rejection would pick chunk 1 (0.7 of them) and so B far too often: A would fall to 0.45."""
    probs = torch.full((32,), 1e-12)
    probs[3], probs[17] = 0.3, 0.2
    probs[18:32] = 0.5 / 14
    row = probs.log().to(DEV)
    want = _allowed_distribution(row, 1.0, 32, 0.35, 0.0)
    assert want[3].item() == pytest.approx(0.6) and int((want > 0).sum()) == 2
    _check_draws(row, 300, (1.0, 32, 0.35, 0.0), block=16, tv_max=0.07)  # TV 0.01 here; 0.16 with stale masses


def test_sampling_kernel_edge_rows():
    """Per-row parameters in one launch: top_k 1, min_p 0.99 and a tiny top_p all give the argmax;
    masked (-inf) tokens are never drawn even when they hold the largest logits."""
    torch.manual_seed(0)
    v, reps = 24, 8
    row = torch.randn(v) * 2
    masked = row.clone()
    masked[row.topk(3).indices] = float("-inf")
    logits = torch.stack([row, row, row, masked] * reps).to(DEV)
    ids = sample_rows(logits, [1.0, 1.0, 1.0, 1.0] * reps, [1, v, v, v] * reps, [1.0, 1.0, 1e-6, 1.0] * reps,
                      [0.0, 0.99, 0.0, 0.0] * reps, block=16).view(reps, 4)
    assert (ids[:, :3] == int(row.argmax())).all()
    assert not torch.isin(ids[:, 3], row.topk(3).indices.to(DEV)).any()


# -- small-batch GEMV ---------------------------------------------------------------------------
GEMV_TINY = {"block_n": 16, "block_k": 32, "num_warps": 4, "stages": 3}


@pytest.mark.parametrize("m", [1, 2, 3, 8])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype,n,k", [(torch.float32, 48, 64), (torch.float16, 50, 72)])
def test_gemv_matches_reference(m, bias, dtype, n, k):
    x = torch.randn(m, k, device=DEV).to(dtype)
    w = torch.randn(n, k, device=DEV).to(dtype)
    b = torch.randn(n, device=DEV).to(dtype) if bias else None
    want = ref.gemv_ref(x, w, b)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    _close(gemv(x, w, b, config=GEMV_TINY), want, tol)  # several K tiles, ragged N
    _close(gemv(x, w, b, config=dict(GEMV_TINY, unroll=2)), want, tol)  # 2 tiles of 16 per step
    _close(gemv(x, w, b), want, tol)  # the default config: one masked K tile


def test_linear_layers_route_small_batches_to_the_gemv(monkeypatch):
    import radixflow.kernels.gemv as gemv_module
    from radixflow.runtime.execution.layers.parallel_linear import merged_column_parallel_linear, row_parallel_linear

    calls = []
    monkeypatch.setattr(gemv_module, "gemv", lambda *a, **kw: calls.append(a[0].shape[0]) or gemv(*a, **kw))
    col = merged_column_parallel_linear(64, [24, 24], bias=True).to(DEV)
    row = row_parallel_linear(48, 32, bias=False).to(DEV)
    x = torch.randn(9, 64, device=DEV)
    for layer in (col, row):
        layer.gemv_max_m = 8
    want = row(col(x))  # 9 rows: F.linear
    assert calls == []
    assert torch.equal(want, cpu_linear.linear(cpu_linear.linear(x, col.weight, col.bias), row.weight))
    _close(row(col(x[:3])), want[:3], 1e-4)  # 3 rows: the GEMV
    assert calls == [3, 3]


@pytest.mark.parametrize("m", [1, 7, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_cpu_linear_matches_f_linear(m, bias):
    x, w = torch.randn(m, 96), torch.randn(200, 96)
    b = torch.randn(200) if bias else None
    assert cpu_linear.enabled, "this torch build must have oneDNN's linear (the CPU path depends on it)"
    got = cpu_linear.linear(x, w, b)
    assert cpu_linear.enabled, "oneDNN's linear failed and the layer fell back to F.linear"
    assert got.dtype == torch.float32 and got.shape == (m, 200)
    _close(got, F.linear(x.double(), w.double(), None if b is None else b.double()).float(), 5e-4)
    x16, w16 = x.bfloat16(), w.bfloat16()
    assert torch.equal(cpu_linear.linear(x16, w16), F.linear(x16, w16))  # not float32: torch's own path


def test_cpu_linear_is_what_the_layers_and_head_call(monkeypatch):
    from radixflow.runtime.execution.layers.parallel_linear import ParallelLMHead, merged_column_parallel_linear

    calls = []
    monkeypatch.setattr(cpu_linear, "linear", lambda x, w, b=None: calls.append(tuple(w.shape)) or F.linear(x, w, b))
    layer, head = merged_column_parallel_linear(32, [24, 24], bias=True), ParallelLMHead(100, 32)
    x = torch.randn(5, 32)
    layer(x), head.logits(x)
    assert calls == [(48, 32), (100, 32)]


def test_head_logits_into_a_given_buffer():
    """The decode graphs' shared logits: head.logits(x, out=rows of one buffer) fills those rows with what it
    returns without `out`, and returns that view (its other rows untouched)."""
    from radixflow.runtime.execution.layers.parallel_linear import ParallelLMHead

    head = ParallelLMHead(100, 32)
    x = torch.randn(5, 32)
    buf = torch.full((8, 100), 7.0)
    got = head.logits(x, out=buf[:5])
    assert got.data_ptr() == buf.data_ptr() and torch.equal(got, head.logits(x)) and (buf[5:] == 7.0).all()


@pytest.mark.parametrize("m", [1, TINY_M + 5, SMALL_M + 6])  # each tile config
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype,out_dtype", [(torch.float32, None), (torch.float16, None), (torch.float16, torch.float32)])
def test_matmul_batch_invariant_matches_reference(m, bias, dtype, out_dtype):
    x = torch.randn(m, 100, device=DEV).to(dtype)  # K: one full and one masked tile
    w = torch.randn(40, 100, device=DEV).to(dtype)
    b = torch.randn(40, device=DEV).to(dtype) if bias else None
    got = matmul_batch_invariant(x, w, b, out_dtype=out_dtype)
    want = ref.gemv_ref(x.float(), w.float(), None if b is None else b.float())  # the contract, unrounded
    _close(got, want.to(out_dtype or dtype), 1e-4 if got.dtype == torch.float32 else 2e-2)


def _rows_do_not_depend_on_the_batch(x: torch.Tensor, w: torch.Tensor, ms: tuple, **kw) -> None:
    full = matmul_batch_invariant(x, w, **kw)
    for m in ms:
        assert torch.equal(matmul_batch_invariant(x[:m], w, **kw), full[:m]), m


def test_matmul_rows_do_not_depend_on_the_batch():
    """Within each tile config (the interpreter's numpy dot sums a 128-wide K tile in another order
    than two 64-wide ones, so across configs only the GPU test below can check)."""
    w = torch.randn(24, 300, device=DEV).to(torch.float16)
    for ms in ((1, 3, TINY_M), (TINY_M + 1, SMALL_M - 3, SMALL_M), (SMALL_M + 1, SMALL_M + 9)):
        x = torch.randn(ms[-1], 300, device=DEV).to(torch.float16)
        _rows_do_not_depend_on_the_batch(x, w, ms[:-1])


def test_linear_layers_and_head_route_to_the_batch_invariant_matmul(monkeypatch):
    import radixflow.kernels.matmul as matmul_module
    from radixflow.runtime.execution.layers.parallel_linear import ParallelLMHead, row_parallel_linear

    calls = []
    monkeypatch.setattr(matmul_module, "matmul_batch_invariant",
                        lambda x, *a, **kw: calls.append(kw.get("out_dtype")) or torch.zeros(1))
    layer, head = row_parallel_linear(48, 32, bias=False), ParallelLMHead(100, 32)
    x = torch.randn(3, 48)
    layer.batch_invariant = head.batch_invariant = True
    layer(x), head.logits(x[:, :32])  # CPU tensors: torch, whatever the flag (deterministic mode needs CUDA)
    assert calls == []
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    layer(x), head.logits(x[:, :32])
    assert calls == [None, torch.float32]  # the head keeps float32 logits


@pytest.mark.parametrize("rows,vocab", [(1, 300), (3, 257), (2, 40)])
def test_argmax_rows_matches_torch(rows, vocab):
    """Two passes over blocks of 64: ties across blocks and within one go to the lowest index, an
    all -inf row (every token masked) gives 0, and a row shorter than a block takes torch's path."""
    x = torch.randn(rows, vocab, device=DEV)
    x[0, [5, vocab - 1, 70 % vocab]] = 9.0  # a tie across blocks (and the last entry)
    if rows > 2:
        x[1] = float("-inf")
        x[2, 130:140] = 7.5  # a tie inside one block
    assert torch.equal(argmax_rows(x, block=64), x.argmax(dim=-1))
    assert argmax_rows(x, block=64)[0].item() == 5


@pytest.mark.parametrize("vocab", [100, 64])
def test_bitmask_matches_reference(vocab):
    logits = torch.randn(3, vocab, device=DEV)
    words = (vocab + 31) // 32
    mask = torch.randint(-(2**31), 2**31 - 1, (3, words), dtype=torch.int32, device=DEV)
    mask[1] = -1  # all allowed
    got, want = logits.clone(), logits.clone()
    apply_token_bitmask_triton(got, mask)
    apply_token_bitmask_torch(want, mask)
    assert torch.equal(got, want)
    assert torch.equal(got[1], logits[1])
    assert torch.isinf(got).any()


@pytest.mark.parametrize("vocab", [100, 64, 49152])
def test_bitmask_byte_table_matches_reference(vocab):
    from radixflow.kernels.bitmask import apply_token_bitmask_lut

    logits = torch.randn(4, vocab)
    logits[2, :5] = float("-inf")  # already banned stays banned
    mask = torch.randint(-(2**31), 2**31 - 1, (4, (vocab + 31) // 32), dtype=torch.int32)
    mask[1] = -1
    got, want = logits.clone(), logits.clone()
    apply_token_bitmask_lut(got, mask)
    apply_token_bitmask_torch(want, mask)
    assert torch.equal(got, want) and torch.equal(got[1], logits[1])


def test_bitmask_dispatch_on_cpu_uses_torch():
    logits = torch.zeros(1, 40)
    mask = torch.tensor([[0b101, 0]], dtype=torch.int32)
    apply_token_bitmask(logits, mask)
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert allowed == [0, 2]


# -- attention ----------------------------------------------------------------------------------
DECODE_VARIANTS = {  # decode_attention's launch configs (see its module doc) at tiny shapes
    "default": {"block_n": 64, "num_warps": 4, "num_stages": 2},
    "stage2": {"block_n": 64, "direct": False},
    "block16": {"block_n": 16},
    "split_align": {"block_n": 16, "split_align": 4},
    "small": {"block_n": 64, "small": {"max_batch": 3, "block_n": 16, "split_align": 4, "direct": False}},
}


@pytest.mark.parametrize(
    "variant,splits,hq,hkv", [(v, s, 6, 2) for v in DECODE_VARIANTS for s in (1, 4)] + [("default", 4, 4, 4)]
)
def test_decode_attention_matches_reference(variant, splits, hq, hkv):
    seq_lens = [70, 7, 1]  # with 4 splits some are empty
    k_buf, v_buf, table, req_idx = _paged_pool(seq_lens, hkv, 16, torch.float32)
    q = torch.randn(len(seq_lens), hq, 16, device=DEV)
    lens = torch.tensor(seq_lens, device=DEV)
    got = decode_attention(q, k_buf, v_buf, table, req_idx, lens, 0.25, splits, config=DECODE_VARIANTS[variant])
    want = ref.decode_attention_ref(q, k_buf, v_buf, table, req_idx, lens, 0.25)
    _close(got, want, 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("splits", [1, 4])
def test_decode_attention_with_rotary_equals_rotary_then_attention(dtype, splits):
    """With `rope`, decode attention rotates q and the new k itself and stores k / v at the new
    slot: the same pool and output as the rotary + KV-store kernel followed by plain attention."""
    from radixflow.kernels.decode_attention import DecodeRope

    seq_lens, hq, hkv, d = [70, 7, 1], 6, 2, 16
    k_buf, v_buf, table, req_idx = _paged_pool(seq_lens, hkv, d, dtype)
    lens = torch.tensor(seq_lens, device=DEV)
    loc = table[req_idx, lens - 1].long()  # the new token's slot: the last of each sequence
    positions = lens - 1
    cos, sin = _rope_tables(128, d)
    qkv = torch.randn(len(seq_lens), (hq + 2 * hkv) * d, device=DEV).to(dtype)
    q, k, v = (t.view(len(seq_lens), -1, d) for t in qkv.split([hq * d, hkv * d, hkv * d], dim=-1))
    pools = [(k_buf.clone(), v_buf.clone()) for _ in range(3)]
    fused = decode_attention(q.clone(), *pools[0], table, req_idx, lens, 0.25, splits,
                             rope=DecodeRope(positions, cos, sin, k.clone(), v.clone(), loc))
    q2, k2 = q.clone(), k.clone()
    apply_rotary_store_kv(positions, q2, k2, v, cos, sin, *pools[1], loc)
    separate = decode_attention(q2, *pools[1], table, req_idx, lens, 0.25, splits)
    rq, rk = ref.rotary_ref(positions, q, k, cos, sin)
    ref.store_kv_ref(*pools[2], loc, rk, v)
    want = ref.decode_attention_ref(rq, *pools[2], table, req_idx, lens, 0.25)
    tol = 1e-5 if dtype == torch.float32 else 2e-3  # the kernels may contract into FMAs differently
    for a, b, c in zip(pools[0], pools[1], pools[2]):  # the same rotated k, v in the same slots
        _close(a, b, tol)
        _close(a, c, tol)
    _close(fused, separate, tol)
    _close(fused, want, tol)


def test_extend_attention_prefix_plus_causal():
    prefix, extend = [10, 0, 3], [20, 5, 4]
    hq, hkv, d = 6, 2, 16
    k_buf, v_buf, table, req_idx = _paged_pool([p + e for p, e in zip(prefix, extend)], hkv, d, torch.float32)
    q = torch.randn(sum(extend), hq, d, device=DEV)
    pre = torch.tensor(prefix, device=DEV)
    ext = torch.tensor(extend, device=DEV)
    starts = torch.tensor([0, 20, 25], device=DEV)
    got = extend_attention(q, k_buf, v_buf, table, req_idx, pre, ext, starts, max(extend), 0.25)
    want = ref.extend_attention_ref(q, k_buf, v_buf, table, req_idx, pre, ext, 0.25)
    _close(got, want, 1e-5)


@pytest.mark.parametrize("hq,hkv", [(4, 4), (6, 2), (8, 2)])
def test_extend_attention_few_new_tokens_after_long_prefixes(hq, hkv):
    """A program's rows are one request's (token, query head) pairs of one KV head (groups of 1, 3 and 4):
    requests of one token (16-row blocks padded), a request without a prefix, and one whose rows take two
    32-row blocks (11 tokens; with a group of 3 the heads of token 10 are split between the blocks)."""
    torch.manual_seed(1)
    prefix, extend = [40, 0, 17, 33], [1, 3, 11, 5]
    d = 16
    k_buf, v_buf, table, req_idx = _paged_pool([p + e for p, e in zip(prefix, extend)], hkv, d, torch.float32)
    qkv = torch.randn(sum(extend), (hq + 2 * hkv) * d, device=DEV)  # q as the model passes it: a view of qkv
    q = qkv[:, : hq * d].view(-1, hq, d)
    pre, ext = torch.tensor(prefix, device=DEV), torch.tensor(extend, device=DEV)
    starts = torch.tensor([0, 1, 4, 15], device=DEV)
    got = extend_attention(q, k_buf, v_buf, table, req_idx, pre, ext, starts, max(extend), 0.25)
    want = ref.extend_attention_ref(q, k_buf, v_buf, table, req_idx, pre, ext, 0.25)
    _close(got, want, 1e-5)
    one = extend_attention(q[:1], k_buf, v_buf, table, req_idx[:1], pre[:1], ext[:1], starts[:1], 1, 0.25)
    _close(one, want[:1], 1e-5)  # 1-token requests alone: hkv programs of one 16-row block


def test_extend_warm_up_launches_every_block_size(monkeypatch):
    """The start-up warm-up launches the extend kernel at each block size a pass may pick (16-128 rows for
    16-bit q; 16-32 for float32, which it also runs here), so none compiles mid-run."""
    from radixflow.kernels import extend_attention as ea

    k_buf, v_buf, table, _ = _paged_pool([8], 2, 16, torch.float32)
    assert ea.warm_up(torch.float32, k_buf, v_buf, 8, table) == [16, 32]  # runs in the interpreter off CUDA
    launched = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kw: launched.append((kw["BLOCK_M"], kw["num_warps"]))

    monkeypatch.setattr(ea, "_extend_kernel", Recorder())
    assert ea.warm_up(torch.float16, k_buf.half(), v_buf.half(), 8, table) == [16, 32, 64, 128]
    assert launched == [(16, 4), (32, 4), (64, 4), (128, 8)]
    picked = {ea._blocks(torch.float16, 16, rows)[0] for rows in range(1, 5000)}
    assert picked == {m for m, _ in launched}


@pytest.mark.parametrize("dtype", [torch.float16, pytest.param(torch.bfloat16, marks=[gpu, needs_cuda])])
@pytest.mark.parametrize("kernel", ["decode", "extend"])
def test_split_p_brings_16bit_attention_to_float32(kernel, dtype):
    """p split into two 16-bit parts against the float32 reference on the same inputs: rounded once,
    p is ~100x farther off. fp16's 2 parts (22 bits) reach float32's rounding; bf16's hold 16 bits.
    The interpreter's bf16 dot is unusable, so bf16 runs on the GPU only."""
    from radixflow.kernels.settings import KernelSettings

    torch.manual_seed(0)
    seq_lens, hq, hkv, d = [70, 9], 4, 2, 16
    k_buf, v_buf, table, req_idx = _paged_pool(seq_lens, hkv, d, dtype)
    lens = torch.tensor(seq_lens, device=DEV)
    q = torch.randn(len(seq_lens) if kernel == "decode" else sum(seq_lens), hq, d, device=DEV).to(dtype)

    def run(parts: int) -> torch.Tensor:
        out = torch.empty_like(q, dtype=torch.float32)  # unrounded: the error of the attention itself
        settings = KernelSettings(attention_p_parts=parts)
        if kernel == "decode":
            return decode_attention(q, k_buf, v_buf, table, req_idx, lens, 0.25, 1, out=out, settings=settings)
        zero = torch.zeros_like(lens)
        return extend_attention(q, k_buf, v_buf, table, req_idx, zero, lens, torch.tensor([0, 70], device=DEV),
                                max(seq_lens), 0.25, out=out, settings=settings)

    inputs = (q.float(), k_buf.float(), v_buf.float(), table, req_idx)
    if kernel == "decode":
        want = ref.decode_attention_ref(*inputs, lens, 0.25)
    else:
        want = ref.extend_attention_ref(*inputs, torch.zeros_like(lens), lens, 0.25)
    err = {parts: (run(parts) - want).abs().max().item() for parts in (1, 2)}
    if dtype == torch.float16:
        assert err[2] < 2e-6 and err[2] * 20 < err[1], err
    else:
        assert err[2] < 2e-5 and err[2] * 20 < err[1], err


MAX_16 = {"max_splits": 16}  # an explicit config: DECODE_CONFIG's `small` does not apply


def test_num_kv_splits_fills_the_gpu_and_is_capped():
    assert num_kv_splits(1, 8, 132, waves=2, config=MAX_16) == 16
    assert num_kv_splits(64, 8, 132, waves=2, config=MAX_16) == 1
    assert num_kv_splits(64, 8, 132, waves=4, config=MAX_16) == 2
    assert all(num_kv_splits(b, 8) & (num_kv_splits(b, 8) - 1) == 0 for b in range(1, 300))
    assert num_kv_splits(1, 8, 132, config={"max_splits": 64}) == 64


def test_deterministic_decode_config_is_the_same_at_every_batch_size():
    from types import SimpleNamespace

    from radixflow.kernels.decode_attention import DETERMINISTIC_CONFIG, resolve_config
    from radixflow.radix_cache.memory_pool import KVPool, ReqToTokenPool
    from radixflow.runtime.execution.attention.triton_backend import TritonBackend
    from radixflow.runtime.execution.forward_batch import ForwardMode
    from radixflow.runtime.server_args import ServerArgs

    for pool in ("bf16", "fp16", "fp8", "float32"):  # no entry of DECODE_CONFIG (`small`, the pools') applies
        shape = dict(pool=pool, head_dim=128)  # the shape the `bf16` entry was timed at
        configs = {str(resolve_config(b, DETERMINISTIC_CONFIG, kv_heads=8, **shape)) for b in (1, 2, 8, 64, 256, 1024)}
        splits = {num_kv_splits(b, 8, 132, config=DETERMINISTIC_CONFIG, **shape) for b in (1, 2, 8, 64, 256, 1024)}
        assert len(configs) == 1 and splits == {DETERMINISTIC_CONFIG["fixed_splits"]}, pool
    kw = dict(kv_pool=KVPool(64, 1, 1, 2, 16, torch.float32, DEV), req_to_token=ReqToTokenPool(2, 32, DEV),
              num_q_heads=4, num_kv_heads=2, head_dim=16)
    bs1 = SimpleNamespace(mode=ForwardMode.DECODE, batch_size=1)
    assert TritonBackend(**kw).rotary_in_attention(bs1)  # the default fuses rotary into small decode batches
    det = ServerArgs(enable_deterministic_inference=True).kernel_settings()  # one rotary kernel for all sizes
    assert not TritonBackend(**kw, deterministic=True, settings=det).rotary_in_attention(bs1)


def test_decode_config_small_batch_overrides(monkeypatch):
    import radixflow.kernels.decode_attention as da

    monkeypatch.setitem(da.DECODE_CONFIG, "small", {"max_batch": 2, "block_n": 16, "max_splits": 32})
    assert da.resolve_config(2)["block_n"] == 16 and da.resolve_config(3)["block_n"] == da.DECODE_CONFIG["block_n"]
    assert num_kv_splits(1, 8, 132) == 32 and num_kv_splits(1, 8, 132, config=MAX_16) == 16
    assert da.resolve_config(1, {"num_warps": 8})["block_n"] == da.DECODE_CONFIG["block_n"]  # no `small`
    assert da.resolve_config(1, {"small": {"max_batch": 1, "split_align": 8}})["split_align"] == 8
    with pytest.raises(ValueError, match="kv_per_prog"):  # a removed variant is not silently ignored
        da.resolve_config(1, {"kv_per_prog": 2})


# -- the Triton backend inside the engine ----------------------------------------------------
def test_triton_backend_matches_torch_native_in_the_engine(tmp_path):
    """Mixed batch (fresh, cache hits, chunked prefill) plus decode, teacher-forced."""
    import json

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from logprob_check import compare, make_prompts, run_candidate, run_reference

    import radixflow
    from radixflow.runtime.execution.attention.torch_native import TorchNativeBackend
    from radixflow.runtime.execution.attention.triton_backend import TritonBackend

    cfg = dict(
        architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=96, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, head_dim=16, vocab_size=512,
        max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
    )
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(cfg))
    engine = radixflow.Engine(
        str(path), load_format="dummy", device=DEV, dtype="float32", max_total_tokens=1024, chunked_prefill_size=32,
        tokenizer_path=_tokenizer_dir(), disable_cuda_graph=True,
    )
    runner = engine.runner
    kw = dict(kv_pool=runner.kv_pool, req_to_token=runner.req_to_token, num_q_heads=6, num_kv_heads=2, head_dim=16)
    warm, batch, starts = make_prompts(512, shared_len=20, long_len=70)
    runner.backend = TritonBackend(**kw)
    cand = run_candidate(engine, warm, batch, starts, new_tokens=4)
    assert engine.scheduler.stats.cached_tokens > 0  # the radix hits happened
    runner.backend = TorchNativeBackend(**kw)
    result = compare(cand, run_reference(engine, warm, cand, starts))
    assert result["scored"] > 100
    assert result["prefill_max_abs"] < 1e-4 and result["decode_max_abs"] < 1e-4, result


def test_engine_imports_without_server_and_grammar_packages():
    code = (
        "import sys\n"
        "for m in ('zmq', 'fastapi', 'uvicorn', 'outlines_core', 'triton'): sys.modules[m] = None\n"
        "import radixflow\n"
        "from radixflow.runtime.engine import Engine\n"
        "from radixflow.runtime.execution.model_runner import ModelRunner\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


def test_graph_batch_sizes_cover_every_batch():
    from radixflow.runtime.execution.cuda_graph_runner import graph_batch_sizes

    sizes = graph_batch_sizes(64)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 64 and sizes == sorted(set(sizes))
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(100)[-2:] == [96, 100]


# -- GPU: real shapes ---------------------------------------------------------------------------
GPU_DECODE_VARIANTS = [  # besides DECODE_CONFIG
    {"direct": False}, {"split_align": 16, "max_splits": 32}, {"block_n": 32, "num_warps": 8, "num_stages": 2},
]


@gpu
@needs_cuda
@pytest.mark.parametrize("seq_lens", [[1, 200, 4097, 33], [130] * 64])
def test_gpu_decode_attention_llama_shapes(seq_lens):
    k_buf, v_buf, table, req_idx = _paged_pool(seq_lens, 8, 128, torch.bfloat16, rows=len(seq_lens) + 1)
    q = torch.randn(len(seq_lens), 32, 128, device=DEV, dtype=torch.bfloat16)
    lens = torch.tensor(seq_lens, device=DEV)
    want = ref.decode_attention_ref(q, k_buf, v_buf, table, req_idx, lens, 128**-0.5)
    for splits in (1, num_kv_splits(len(seq_lens), 8), 16):
        _close(decode_attention(q, k_buf, v_buf, table, req_idx, lens, 128**-0.5, splits), want, 2e-2)
        for config in GPU_DECODE_VARIANTS:
            got = decode_attention(q, k_buf, v_buf, table, req_idx, lens, 128**-0.5, splits, config=config)
            _close(got, want, 2e-2)


@gpu
@needs_cuda
@pytest.mark.parametrize("config", [{}, {"split_align": 16, "max_splits": 32}, {"max_splits": 1}])
def test_gpu_decode_attention_graph_replays_longer_lengths(config):
    """Captured at 5 tokens a request, replayed at up to 3000: nothing in the launch depends on lengths
    (max_splits 1: the direct path, stage 1 alone)."""
    k_buf, v_buf, table, req_idx = _paged_pool([3000, 700], 8, 128, torch.bfloat16, rows=3)
    q = torch.randn(2, 32, 128, device=DEV, dtype=torch.bfloat16)
    lens = torch.tensor([5, 5], device=DEV)
    splits = num_kv_splits(2, 8, config=config)
    decode_attention(q, k_buf, v_buf, table, req_idx, lens, 128**-0.5, splits, config=config)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode_attention(q, k_buf, v_buf, table, req_idx, lens, 128**-0.5, splits, config=config)
    for seq_lens in ([5, 5], [3000, 1], [17, 700]):
        lens.copy_(torch.tensor(seq_lens))
        graph.replay()
        _close(out, ref.decode_attention_ref(q, k_buf, v_buf, table, req_idx, lens, 128**-0.5), 2e-2)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_extend_attention_llama_shapes(dtype):
    prefix, extend = [0, 1000, 4096, 7], [2048, 300, 129, 1]
    k_buf, v_buf, table, req_idx = _paged_pool([p + e for p, e in zip(prefix, extend)], 8, 128, dtype)
    q = torch.randn(sum(extend), 32, 128, device=DEV, dtype=dtype)
    starts = torch.tensor([0, 2048, 2348, 2477], device=DEV)
    pre, ext = torch.tensor(prefix, device=DEV), torch.tensor(extend, device=DEV)
    got = extend_attention(q, k_buf, v_buf, table, req_idx, pre, ext, starts, max(extend), 128**-0.5)
    want = ref.extend_attention_ref(q, k_buf, v_buf, table, req_idx, pre, ext, 128**-0.5)
    _close(got, want, 2e-2 if dtype == torch.bfloat16 else 1e-4)


@gpu
@needs_cuda
def test_gpu_elementwise_kernels_bf16():
    x = torch.randn(64, 4096, device=DEV, dtype=torch.bfloat16)
    r = torch.randn(64, 4096, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(4096, device=DEV, dtype=torch.bfloat16)
    for res_in in (r, 30 * r.float()):  # a bf16 stream, and the float32 one the model keeps
        out, res = rmsnorm(x, w, 1e-5, res_in)
        ref_out, ref_res = ref.rmsnorm_ref(x, w, 1e-5, res_in)
        assert torch.equal(res, ref_res) and res.dtype == res_in.dtype
        _close(out, ref_out, 0.07)  # at most ~1 bf16 ulp of values up to ~8
        assert (out != ref_out).float().mean().item() < 0.01
    gu = torch.randn(64, 2 * 14336, device=DEV, dtype=torch.bfloat16)
    _close(silu_and_mul(gu), ref.silu_and_mul_ref(gu), 0.07)
    cos, sin = _rope_tables(8192, 128)
    pos = torch.randint(0, 8192, (64,), device=DEV)
    q = torch.randn(64, 32, 128, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(64, 8, 128, device=DEV, dtype=torch.bfloat16)
    want_q, want_k = ref.rotary_ref(pos, q, k, cos, sin)
    got_q, got_k = apply_rotary(pos, q.clone(), k.clone(), cos, sin)
    _close(got_q, want_q, 0.07)
    _close(got_k, want_k, 0.07)
    logits = torch.randn(64, 128256, device=DEV)
    mask = torch.randint(-(2**31), 2**31 - 1, (64, 4008), dtype=torch.int32, device=DEV)
    got, want = logits.clone(), logits.clone()
    apply_token_bitmask(got, mask)
    apply_token_bitmask_torch(want, mask)
    assert torch.equal(got, want)


@gpu
@needs_cuda
@pytest.mark.parametrize("t", [1, 64])
def test_gpu_rotary_store_kv_llama_shapes(t):
    (qkv, k_buf, v_buf), (want_qkv, want_k, want_v) = _rotary_store_both_ways(
        t, 32, 8, 128, torch.bfloat16, max_pos=8192, slots=4096
    )
    _close(qkv, want_qkv, 0.07)
    _close(k_buf, want_k, 0.07)
    assert torch.equal(v_buf, want_v)
    # bit for bit what the two separate kernels do
    cos, sin = _rope_tables(8192, 128)
    pos, loc = torch.randint(0, 8192, (t,), device=DEV), torch.randperm(4096, device=DEV)[:t]
    qkv = torch.randn(t, 48 * 128, device=DEV, dtype=torch.bfloat16)
    bufs = [torch.randn(4096, 8, 128, device=DEV, dtype=torch.bfloat16) for _ in range(2)]
    sep_qkv, sep_bufs = qkv.clone(), [b.clone() for b in bufs]
    apply_rotary_store_kv(pos, *_split_qkv(qkv, 32, 8, 128), cos, sin, *bufs, loc)
    q, k, v = _split_qkv(sep_qkv, 32, 8, 128)
    apply_rotary(pos, q, k, cos, sin)
    store_kv(*sep_bufs, loc, k, v)
    assert torch.equal(qkv, sep_qkv) and all(torch.equal(a, b) for a, b in zip(bufs, sep_bufs))


@gpu
@needs_cuda
@pytest.mark.parametrize("n,k,bias", [(6144, 4096, True), (4096, 14336, False), (128256, 4096, False)])
def test_gpu_gemv_llama_shapes(n, k, bias):
    w = (torch.randn(n, k, device=DEV) * k**-0.5).to(torch.bfloat16)
    b = torch.randn(n, device=DEV, dtype=torch.bfloat16) if bias else None
    for m in (1, 3, 8):
        x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
        for config in GEMV_CONFIGS:
            got = gemv(x, w, b, config=config)
            _close(got, ref.gemv_ref(x, w, b), 0.07)  # ~1 bf16 ulp of outputs up to ~8
            _close(got, F.linear(x, w, b), 0.1)
    x32, w32 = torch.randn(2, k, device=DEV), w[:4096].float()
    _close(gemv(x32, w32), ref.gemv_ref(x32, w32), 1e-3)


@gpu
@needs_cuda
@pytest.mark.parametrize("rows", [1, 7, 256])
def test_gpu_argmax_rows_llama_vocab(rows):
    x = torch.randn(rows, 128256, device=DEV) * 4
    x[0, [1000, 90000]] = 100.0  # tie: the lower index wins
    assert torch.equal(argmax_rows(x), x.argmax(dim=-1)) and argmax_rows(x)[0].item() == 1000


@gpu
@needs_cuda
def test_gpu_gemv_chooser_and_cuda_graph():
    layers = [(torch.randn(6144, 4096, device=DEV, dtype=torch.bfloat16), None) for _ in range(3)]
    max_m, config, timings = choose_gemv(layers)
    assert max_m in (0, 1, 2, 4, 8) and sorted(timings) == [1, 2, 4, 8] and config in GEMV_CONFIGS
    assert all(0 < t < 1e4 for pair in timings.values() for t in pair)
    x = torch.randn(1, 4096, device=DEV, dtype=torch.bfloat16)
    eager = gemv(x, layers[0][0])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemv(x, layers[0][0])
    graph.replay()
    assert torch.equal(out, eager)


@gpu
@needs_cuda
def test_gpu_sampling_kernel_llama_vocab():
    """At the Llama-3 vocabulary, a peaked row (logits N(0, 4^2)), 4096 draws: top-p 0.9 and
    top-k 50 with min-p, against the sort-based distribution."""
    gen = torch.Generator(device=DEV).manual_seed(3)
    row = torch.randn(128256, device=DEV, generator=gen) * 4
    _check_draws(row, 4096, (0.8, 128256, 0.9, 0.0), block=4096, tv_max=0.05)
    _check_draws(row, 4096, (1.0, 50, 1.0, 0.01), block=4096, tv_max=0.05)


def _seeded(seed, position: int = 0, **params):
    """A request stand-in for the sampler: sampling params and a seed, `position` output tokens in."""
    from types import SimpleNamespace

    from radixflow.runtime.sampling_params import SamplingParams

    sp = SamplingParams(**{"temperature": 0.8, "top_p": 0.9, **params}, sampling_seed=seed)
    return SimpleNamespace(sampling=sp, origin_input_ids=[1, 2, 3], kv_len=3 + position)


def test_batch_invariant_sampler_draws_each_row_alone(monkeypatch):
    """Deterministic inference: torch's sampling path runs on one row at a time, from uniforms
    drawn once for the batch; on the CPU (where a row's sums do not depend on the row count)
    every row, seeded or not, draws what the batched pass draws from the same generator state."""
    from radixflow.runtime.scheduling import sampler

    torch.manual_seed(0)
    logits = torch.randn(8, 500) * 3
    reqs = [_seeded(None if i % 3 else 5, i, top_p=1.0 if i % 2 else 0.9) for i in range(8)]
    rows, uniforms = [], []
    real, real_u = sampler._sample_torch, sampler.row_uniforms
    monkeypatch.setattr(sampler, "_sample_torch", lambda lg, *a: rows.append(lg.shape[0]) or real(lg, *a))
    monkeypatch.setattr(sampler, "row_uniforms", lambda keys: uniforms.append(len(keys)) or real_u(keys))
    torch.manual_seed(1)
    one_by_one = sampler.sample_from(logits.clone(), reqs, batch_invariant=True, triton=False)
    assert rows == [1] * 8 and uniforms == [8]
    rows.clear()
    torch.manual_seed(1)
    batched = sampler.sample_from(logits.clone(), reqs, triton=False)
    assert rows == [8]  # the default: the whole batch at once, seeded rows included
    assert torch.equal(one_by_one, batched) and len(set(batched.tolist())) > 4


def test_unseeded_rows_draw_fresh_random_numbers():
    """Unseeded rows take new random numbers on every row and every call: 64 identical rows of a
    flat distribution over 40 tokens differ among themselves and from the next call's, on torch's
    path and in the kernel."""
    from radixflow.runtime.scheduling import sampler

    torch.manual_seed(0)
    logits = torch.zeros(64, 40, device=DEV)
    reqs = [_seeded(None, top_p=1.0) for _ in range(64)]
    first, second = (sampler.sample_from(logits.clone(), reqs, triton=False) for _ in range(2))
    assert len(set(first.tolist())) > 10 and not torch.equal(first, second)
    first, second = (sample_rows(logits, [1.0] * 64, [40] * 64, [1.0] * 64, [0.0] * 64, block=16) for _ in range(2))
    assert len(set(first.tolist())) > 10 and not torch.equal(first, second)


@pytest.mark.parametrize("path", ["torch", "kernel"])
def test_seeded_rows_draw_by_seed_and_position_in_one_batch(path):
    """A seeded row's token is a function of its logits, its seed and its output position: the same
    alone, at another row among other seeded and unseeded rows, and on another run; other seeds
    draw other tokens, and over positions the draws follow the truncated distribution. Torch's
    path (CPU) and the Triton kernel (interpreted here), each in one batched pass."""
    from radixflow.runtime.scheduling.sampler import _sample_torch, draw_keys, draw_uniforms

    torch.manual_seed(0)
    row = torch.linspace(3, -3, 40)[torch.randperm(40)].to(DEV)
    params = (0.9, 40, 0.8, 0.0)

    def draw(reqs: list, rows=None) -> list:
        lg = row.repeat(len(reqs), 1) if rows is None else rows
        per_row = [[x] * len(reqs) for x in params]
        if path == "kernel":
            return sample_rows(lg.contiguous(), *per_row, block=16, keys=draw_keys(reqs)).tolist()
        return _sample_torch(lg, *per_row, draw_uniforms(draw_keys(reqs), DEV)).tolist()

    n = 100 if path == "torch" else 40  # the kernel's distribution: test_sampling_kernel_draws_from_...
    stream = draw([_seeded(7, p) for p in range(n)])  # positions 0..n-1 of seed 7, as one batch
    want = _allowed_distribution(row, *params).cpu()
    got = torch.bincount(torch.tensor(stream), minlength=40).float() / n
    assert (got[want == 0] == 0).all(), "drew a token outside top-p"
    assert path == "kernel" or 0.5 * (got - want).abs().sum().item() < 0.2
    torch.manual_seed(123)  # the unseeded rows' generator state does not matter
    others = torch.randn(3, 40, device=DEV) * 3
    for p in (0, 37, n - 1):
        assert draw([_seeded(7, p)]) == [stream[p]]  # alone
        mixed = [_seeded(None), _seeded(11, 5), _seeded(7, p), _seeded(None)]
        assert draw(mixed, torch.cat([others[:2], row[None], others[2:]]))[2] == stream[p]
    m = 10
    streams = draw([_seeded(s, p) for s in (8, 2**40 + 7, -1) for p in range(m)])
    assert all(streams[i * m : (i + 1) * m] != stream[:m] for i in range(3))  # other seeds: other streams


@pytest.mark.parametrize("cut", [(40, 1.0, 0.0), (5, 0.9, 0.1)], ids=["no_cut", "cuts"])
def test_torch_sampling_path_gives_an_in_range_id_for_rows_without_mass(cut):
    """A row whose tokens are all banned (-inf) or whose logits hold a NaN has no mass to draw
    from: torch's path takes the row's argmax (the kernel's choice for such a row, token 0 when
    all are -inf) instead of the id one past the vocabulary; the other rows still draw."""
    from radixflow.runtime.scheduling.sampler import _sample_torch, draw_uniforms

    torch.manual_seed(0)
    logits = torch.randn(4, 40, device=DEV)
    logits[0] = float("-inf")
    logits[1, 5] = float("nan")
    logits[3] = float("-inf")
    logits[3, 17] = 0.0  # one token left: always drawn
    u = draw_uniforms([None, None, (3, 0), (3, 1)], DEV)
    ids = _sample_torch(logits, [1.0] * 4, *[[x] * 4 for x in cut], u).tolist()
    assert ids[0] == 0 and 0 <= ids[1] < 40 and 0 <= ids[2] < 40 and ids[3] == 17


def test_keyed_uniforms_are_uniform_and_independent_across_keys():
    """Torch's path's counter-based uniforms: in [0, 1) and evenly spread; uncorrelated between
    consecutive positions of a seed, between seeds s and s + 1, and between seeds differing only
    in their high 32 bits (which must count)."""
    from radixflow.runtime.scheduling.sampler import keyed_uniforms

    positions = torch.arange(20000)
    u = keyed_uniforms(torch.full_like(positions, 3), positions)
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.01
    assert torch.histc(u, bins=10, min=0, max=1).min() > 1800  # ~2000 a bin

    def corr(a: torch.Tensor, b: torch.Tensor) -> float:
        return abs(torch.corrcoef(torch.stack([a, b]))[0, 1].item())  # ~0.007 for independent draws

    assert corr(u[:-1], u[1:]) < 0.03
    for other in (4, 3 + 2**32):
        v = keyed_uniforms(torch.full_like(positions, other), positions)
        assert (u != v).float().mean() > 0.99 and corr(u, v) < 0.03


@gpu
@needs_cuda
def test_gpu_sampler_routes_sampled_batches_to_the_kernel(monkeypatch):
    from types import SimpleNamespace

    from radixflow.kernels import sampling
    from radixflow.runtime.scheduling import sampler
    from radixflow.runtime.sampling_params import SamplingParams

    calls = []
    monkeypatch.setattr(sampling, "sample_rows", lambda *a, **kw: calls.append(1) or torch.zeros(2, dtype=torch.int64, device=DEV))
    logits = torch.randn(2, 1000, device=DEV)
    reqs = [SimpleNamespace(sampling=SamplingParams(temperature=0.7, top_p=0.9)) for _ in range(2)]
    sampler.sample_from(logits.clone(), reqs)
    assert calls == [1]
    reqs[1] = _seeded(0, temperature=0.7)
    out = sampler.sample_from(logits.clone(), reqs)
    assert calls == [1, 1] and out.shape == (2,)  # a seeded row: the kernel too, in the same pass
    plain = [SimpleNamespace(sampling=SamplingParams(temperature=0.7)) for _ in range(2)]
    sampler.sample_from(logits.clone(), plain)
    assert calls == [1, 1, 1]  # temperature alone: the kernel too
    sampler.sample_from(logits.clone(), [SimpleNamespace(sampling=SamplingParams(temperature=0.0))] * 2)
    assert calls == [1, 1, 1]  # greedy: argmax, no draw


def _decode_like_chain(x, res, norm_w, w_up, w_down, settings, layers: int = 6):
    """RMSNorm -> GEMV -> SiLU-and-mul -> GEMV, `layers` times: each kernel reads the previous one's output."""
    for _ in range(layers):
        h, res = rmsnorm(x, norm_w, 1e-5, res, settings=settings)
        x = gemv(silu_and_mul(gemv(h, w_up, settings=settings), settings), w_down, settings=settings)
    return x, res


@gpu
@needs_cuda
def test_gpu_pdl_chain_in_a_cuda_graph_equals_plain_launches():
    """Kernels launched with PDL start before their predecessor ends (with the early trigger, even
    before the one before that ends); in a captured graph the results must equal ordinary launches
    bit for bit (a missing wait would read stale data)."""
    from radixflow.kernels import pdl
    from radixflow.kernels.settings import DEFAULT_KERNEL_SETTINGS, KernelSettings

    hopper = torch.cuda.get_device_capability()[0] >= 9
    assert not hopper or pdl.pdl_launch(torch.ones(1, device=DEV), DEFAULT_KERNEL_SETTINGS)["USE_PDL"] == 2
    args = [torch.randn(1, 4096, device=DEV, dtype=torch.bfloat16) for _ in range(2)]
    weights = [torch.ones(4096, device=DEV, dtype=torch.bfloat16),
               (torch.randn(28672, 4096, device=DEV) * 0.02).to(torch.bfloat16),
               (torch.randn(4096, 14336, device=DEV) * 0.02).to(torch.bfloat16)]
    outs = []
    for on, early in ((True, True), (True, False), (False, False)):
        settings = KernelSettings(pdl=on, pdl_early_trigger=early)
        _decode_like_chain(*args, *weights, settings)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = _decode_like_chain(*args, *weights, settings)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        outs.append([t.clone() for t in got])
    assert all(torch.equal(a, b) for a, b in zip(outs[0], outs[1])) and all(torch.equal(a, b) for a, b in zip(outs[0], outs[2]))
    eager = _decode_like_chain(*args, *weights, DEFAULT_KERNEL_SETTINGS)
    assert all(torch.equal(a, b) for a, b in zip(outs[0], eager))


@gpu
@needs_cuda
def test_gpu_cuda_graph_decode_equals_eager():
    import radixflow

    cfg = os.path.join(ROOT, "benchmarks", "configs", "smollm2-135m.json")
    tok = _tokenizer_dir()
    prompts = [[(7 * i + j) % 49000 + 3 for j in range(5 + 3 * i)] for i in range(5)]
    params = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}
    outs = []
    for disable in (False, True):
        engine = radixflow.Engine(
            cfg, load_format="dummy", dtype="float32", tokenizer_path=tok, max_total_tokens=4096,
            disable_cuda_graph=disable, cuda_graph_max_bs=8,
        )
        assert (engine.runner.graph_runner is None) == disable
        res = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
        outs.append([[lp for lp, _, _ in r["meta_info"]["output_token_logprobs"]] for r in res])
        engine.shutdown()
    for a, b in zip(*outs):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4


@gpu
@needs_cuda
def test_gpu_decode_graphs_share_one_logits_buffer():
    """Every decode graph writes its logits into one [max_bs, vocab] buffer (each graph's own had taken
    ~16 GiB at max_bs 1,024 on Llama-3's vocabulary); requests ending at different steps walk the batch
    down through several graphs, with the same logprobs as eager decoding."""
    import radixflow

    cfg = os.path.join(ROOT, "benchmarks", "configs", "smollm2-135m.json")
    prompts = [[(11 * i + j) % 49000 + 3 for j in range(4 + 5 * i)] for i in range(7)]
    params = [{"max_new_tokens": 3 + 4 * i, "temperature": 0.0, "ignore_eos": True} for i in range(7)]
    outs = []
    for disable in (False, True):
        engine = radixflow.Engine(cfg, load_format="dummy", dtype="float32", tokenizer_path=_tokenizer_dir(),
                                  max_total_tokens=4096, disable_cuda_graph=disable, cuda_graph_max_bs=8)
        g = engine.runner.graph_runner
        if g is not None:
            assert len(g.graphs) >= 4
            assert {t.data_ptr() for t in g.logits.values()} == {g.logits_out.data_ptr()}
        res = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
        outs.append([[lp for lp, _, _ in r["meta_info"]["output_token_logprobs"]] for r in res])
        engine.shutdown()
    for a, b in zip(*outs):
        assert len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) < 1e-4


@gpu
@needs_cuda
@pytest.mark.parametrize("n,k,out_dtype", [(4096, 4096, None), (6144, 4096, None), (32000, 4096, torch.float32)])
def test_gpu_matmul_batch_invariant_llama_shapes(n, k, out_dtype):
    """Rows are the same bits at every M, across the switches between the three tile configs."""
    x = torch.randn(2048, k, device=DEV, dtype=torch.bfloat16)
    w = (torch.randn(n, k, device=DEV) * 0.02).to(torch.bfloat16)
    ms = (1, 7, TINY_M, TINY_M + 1, SMALL_M, SMALL_M + 1, 300)
    _rows_do_not_depend_on_the_batch(x, w, ms, out_dtype=out_dtype)
    want = ref.gemv_ref(x.float(), w.float())  # the contract, unrounded
    _close(matmul_batch_invariant(x, w, out_dtype=out_dtype), want.to(out_dtype or x.dtype), 0.07)


@gpu
@needs_cuda
@pytest.mark.parametrize("backend", ["triton", "torch_native"])
def test_gpu_deterministic_inference_is_batch_invariant(backend):
    """--enable-deterministic-inference: a request's tokens and every logprob are the same bits alone,
    in a batch of 5 (a CUDA graph) and in a batch of 12 (eager, chunked prefill of the long prompt cut
    elsewhere); greedy, and sampled with its own seed beside unseeded sampled requests."""
    import radixflow

    cfg = os.path.join(ROOT, "benchmarks", "configs", "smollm2-135m.json")
    rng = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 49000, (int(n),), generator=rng).tolist() for n in torch.randint(5, 300, (12,), generator=rng)]
    greedy = {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True}
    sampled = dict(greedy, temperature=0.9, top_p=0.9)
    engine = radixflow.Engine(
        cfg, load_format="dummy", dtype="bfloat16", tokenizer_path=_tokenizer_dir(), max_total_tokens=16384,
        cuda_graph_max_bs=8, chunked_prefill_size=256, attention_backend=backend, enable_deterministic_inference=True,
    )
    try:
        for mine, others in ((greedy, greedy), (dict(sampled, sampling_seed=7), sampled)):
            seen = []
            for batch in (prompts[3:4], prompts[:5], prompts):
                engine.flush_cache()
                params = [mine if p is prompts[3] else others for p in batch]
                res = engine.generate(input_ids=batch, sampling_params=params, return_logprob=True, logprob_start_len=0)
                meta = res[batch.index(prompts[3])]["meta_info"]
                seen.append((meta["input_token_logprobs"], meta["output_token_logprobs"]))
            assert seen[0] == seen[1] == seen[2], mine
    finally:
        engine.shutdown()
