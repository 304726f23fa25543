"""The FlashInfer attention backend.

CPU: the errors that name the fix (package missing, unsupported page size / dtype / device)
and the kv_indptr / kv_indices builders against a loop.
GPU (`gpu`, needs flashinfer): attention of decode and mixed extend batches (fresh requests
and prefix hits) against the torch-native backend in float32, eagerly and through a
captured-and-replayed CUDA graph, at Llama-3-8B heads (32 q / 8 kv / 128) in bf16 and fp16 and
at SmolLM2-135M heads (9 q / 3 kv / 64, CUDA-core decode) in bf16.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, replace

import pytest
import torch

from radixflow.errors import RadixflowError
from radixflow.radix_cache.memory_pool import KVPool, ReqToTokenPool
from radixflow.runtime.execution.attention import create_attention_backend
from radixflow.runtime.execution.attention import flashinfer_backend as fib
from radixflow.runtime.execution.attention.torch_native import TorchNativeBackend
from radixflow.runtime.execution.forward_batch import ForwardBatch, ForwardMode

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _kwargs(page_size=1, dtype=torch.bfloat16, device="cpu", heads=(4, 2, 16), slots=64, layers=1, rows=4, width=64):
    hq, hkv, d = heads
    pool, table = KVPool(slots, page_size, layers, hkv, d, dtype, device), ReqToTokenPool(rows, width, device)
    return dict(kv_pool=pool, req_to_token=table, num_q_heads=hq, num_kv_heads=hkv, head_dim=d)


# -- CPU ------------------------------------------------------------------------------------------
def test_missing_flashinfer_names_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import raises ImportError
    with pytest.raises(RadixflowError, match=r"pip install flashinfer-python.*attention_backend=triton"):
        create_attention_backend("flashinfer", "cuda", **_kwargs())


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(page_size=16), "page_size 1 only"),
        (dict(dtype=torch.float32), "bfloat16 or float16"),
        (dict(), "needs a CUDA device"),
    ],
)
def test_unsupported_setups_are_refused(monkeypatch, kw, match):
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    with pytest.raises(RadixflowError, match=match):
        fib.FlashInferBackend(**_kwargs(**kw))


def test_kv_indptr():
    assert fib.kv_indptr([3, 1, 5]).tolist() == [0, 3, 4, 9]
    assert fib.kv_indptr([2], pad=2).tolist() == [0, 2, 3, 4]
    assert fib.kv_indptr([], pad=3).dtype == torch.int32


def test_kv_indices_match_a_loop():
    g = torch.Generator().manual_seed(0)
    table = torch.randint(0, 10_000, (6, 50), generator=g, dtype=torch.int32)
    rows, lens = torch.tensor([4, 0, 5, 2]), torch.tensor([7, 1, 50, 13])
    got = fib.kv_indices(table, rows, lens, int(lens.sum()))
    want = torch.cat([table[r, :n] for r, n in zip(rows.tolist(), lens.tolist())])
    assert got.dtype == torch.int32 and torch.equal(got, want)


def test_inherited_forward_reaches_the_wrapper(monkeypatch):
    """forward (and forward_rotary, through it or directly) are the Triton backend's: they store K/V, then
    call _attend with the Triton backend's arguments, which FlashInfer's _attend must take. Runs on CPU with
    the KV store and the planned wrapper replaced by recorders."""
    import inspect

    from radixflow.runtime.execution.attention import triton_backend as tb

    assert inspect.signature(fib.FlashInferBackend._attend) == inspect.signature(tb.TritonBackend._attend)
    stored, ran = [], []
    monkeypatch.setattr(tb, "store_kv", lambda *a, **kw: stored.append(a))
    wrapper = types.SimpleNamespace(run=lambda q, kv, enable_pdl: ran.append(kv) or q * 2)
    backend = object.__new__(fib.FlashInferBackend)
    backend.kv_pool = KVPool(64, 1, 1, 2, 16, torch.bfloat16, "cpu")
    q, kv = torch.ones(3, 4, 16, dtype=torch.bfloat16), torch.zeros(3, 2, 16, dtype=torch.bfloat16)
    fb = types.SimpleNamespace(mode=ForwardMode.EXTEND, out_cache_loc=torch.arange(3), attn_metadata=fib.FlashInferPlan(wrapper))
    assert torch.equal(backend.forward(q, kv, kv, 0, fb), q * 2)
    assert len(stored) == 1 and len(ran) == 1 and ran[0][0].shape == (65, 1, 2, 16)  # [slots, page 1, Hkv, D]
    assert not backend.flash_enabled()  # FlashInfer attends every extend row itself (gpu_bench reports this)


# -- GPU: bf16 / fp16 against a float32 torch-native reference ------------------------------------
@dataclass(frozen=True)
class Heads:
    """A model's attention shape and the dtype of its activations and KV pool."""

    hq: int  # query heads
    hkv: int  # KV heads
    d: int  # head dim
    dtype: torch.dtype = torch.bfloat16

    @property
    def tensor_cores(self) -> bool:
        """Whether the backend should decode on tensor cores: from 4 query heads a KV head."""
        return self.hq // self.hkv >= 4

    @property
    def tol(self) -> float:
        return TOL[self.dtype]

    def __str__(self) -> str:
        return f"{self.hq}q/{self.hkv}kv/d{self.d}/{str(self.dtype).removeprefix('torch.')}"


# max abs error against the float32 reference (bf16 measured 0.008 on the H200; fp16 keeps 3 more
# mantissa bits, so ~0.001 is expected: a dtype mix-up errs by O(1) either way)
TOL = {torch.bfloat16: 2e-2, torch.float16: 1e-2}
LLAMA3 = Heads(32, 8, 128)  # Llama-3-8B: decode on tensor cores
LLAMA3_FP16 = replace(LLAMA3, dtype=torch.float16)
SMOLLM2 = Heads(9, 3, 64)  # SmolLM2-135M: head_dim 64, 3 query heads a KV head (CUDA cores)
MIXED = ([0, 1000, 4096, 7, 0], [300, 17, 1, 129, 1])  # fresh, prefix hits, one-token extends
DECODE = ([1, 200, 4097, 33], [1, 1, 1, 1])

GPU_CASES = {  # name: (prefix lens, extend lens, heads)
    "extend_mixed": (*MIXED, LLAMA3),
    "decode_tensor_cores": (*DECODE, LLAMA3),  # 4 query heads a KV head
    "decode_cuda_cores": (*DECODE, Heads(32, 16, 128)),  # 2 a KV head
    "extend_mixed_smollm2": (*MIXED, SMOLLM2),
    "decode_smollm2": (*DECODE, SMOLLM2),  # CUDA cores, group 3
    "extend_mixed_fp16": (*MIXED, LLAMA3_FP16),
    "decode_tensor_cores_fp16": (*DECODE, LLAMA3_FP16),
}
GRAPH_HEADS = {"llama3": LLAMA3, "smollm2": SMOLLM2}  # decode CUDA graphs: tensor cores, CUDA cores


def _pool_and_table(seq_lens: list[int], heads: Heads, layers: int = 2):
    """A pool with random K/V and scattered slots, and its float32 copy; request b owns row b + 1."""
    kw = _kwargs(dtype=heads.dtype, device="cuda", heads=(heads.hq, heads.hkv, heads.d), slots=sum(seq_lens) + 64,
                 layers=layers, rows=len(seq_lens) + 2, width=max(seq_lens) + 8)  # fmt: skip
    pool = kw["kv_pool"]
    for buf in pool.k + pool.v:
        buf.normal_()
    ref_pool = KVPool(pool.k[0].shape[0] - 1, 1, layers, heads.hkv, heads.d, torch.float32, "cuda")
    for src, dst in zip(pool.k + pool.v, ref_pool.k + ref_pool.v):
        dst.copy_(src)
    perm = torch.randperm(pool.k[0].shape[0] - 1, device="cuda") + 1  # slot 0 is scratch
    start = 0
    for b, n in enumerate(seq_lens):
        kw["req_to_token"].table[b + 1, :n] = perm[start : start + n].int()
        start += n
    return kw, ref_pool


def _batch(table: torch.Tensor, prefix: list[int], extend: list[int]) -> ForwardBatch:
    seq = [p + e for p, e in zip(prefix, extend)]
    rows = torch.arange(1, len(seq) + 1, device="cuda")
    locs = torch.cat([table[r, p:s].long() for r, p, s in zip(rows.tolist(), prefix, seq)])
    t = sum(extend)
    mode = ForwardMode.DECODE if all(e == 1 for e in extend) and all(p > 0 for p in prefix) else ForwardMode.EXTEND
    cuda = lambda x: torch.tensor(x, device="cuda")  # noqa: E731
    return ForwardBatch(
        mode=mode, input_ids=torch.zeros(t, dtype=torch.int64, device="cuda"),
        positions=torch.zeros(t, dtype=torch.int64, device="cuda"), out_cache_loc=locs, req_pool_indices=rows,
        seq_lens=cuda(seq), prefix_lens=cuda(prefix), extend_lens=cuda(extend),
        logits_indices=torch.arange(t, device="cuda"), seq_lens_list=seq, prefix_lens_list=prefix,
        extend_lens_list=list(extend),
    )  # fmt: skip


def _reference(ref_pool, kw, fb, q, k, v, layer: int) -> torch.Tensor:
    ref = TorchNativeBackend(**dict(kw, kv_pool=ref_pool))
    ref.init_forward_metadata(fb)
    return ref.forward(q.float(), k.float(), v.float(), layer, fb)


def _qkv(t: int, heads: Heads):
    return (torch.randn(t, n, heads.d, device="cuda", dtype=heads.dtype) for n in (heads.hq, heads.hkv, heads.hkv))


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    assert not torch.isnan(got).any()
    err = (got.float() - want).abs().max().item()
    assert err <= tol, f"max abs error {err} > {tol}"


def attention_error(prefix: list[int], extend: list[int], heads: Heads, layers: int = 2) -> tuple[float, bool]:
    """Max abs error of FlashInferBackend (heads.dtype) against torch-native (float32) over
    `layers` layers of one batch, and whether its decode ran on tensor cores."""
    kw, ref_pool = _pool_and_table([p + e for p, e in zip(prefix, extend)], heads, layers)
    backend = fib.FlashInferBackend(**kw)
    fb = _batch(kw["req_to_token"].table, prefix, extend)
    err = 0.0
    for layer in range(layers):
        q, k, v = _qkv(fb.num_tokens, heads)
        backend.init_forward_metadata(fb)
        got = backend.forward(q, k, v, layer, fb)
        assert got.shape == q.shape and got.dtype == heads.dtype and not torch.isnan(got).any()
        err = max(err, (got.float() - _reference(ref_pool, kw, fb, q, k, v, layer)).abs().max().item())
    return err, backend.tensor_cores


@gpu
@needs_cuda
@pytest.mark.parametrize("case", GPU_CASES)
def test_gpu_matches_torch_native(case):
    pytest.importorskip("flashinfer")
    prefix, extend, heads = GPU_CASES[case]
    err, tensor_cores = attention_error(prefix, extend, heads)
    assert tensor_cores == heads.tensor_cores
    assert err <= heads.tol, f"max abs error {err} > {heads.tol}"


def test_decode_is_never_routed_to_the_triton_kernel():
    """The Triton backend runs small decode batches' rotary inside its own decode kernel; the
    FlashInfer subclass must not, or FlashInfer's decode would never run (and its plan would be
    passed where the Triton kernel expects a split count)."""
    from radixflow.runtime.execution.attention.triton_backend import TritonBackend

    decode = ForwardBatch(
        mode=ForwardMode.DECODE, input_ids=torch.zeros(1, dtype=torch.int64), positions=torch.zeros(1, dtype=torch.int64),
        out_cache_loc=torch.zeros(1, dtype=torch.int64), req_pool_indices=torch.ones(1, dtype=torch.int64),
        seq_lens=torch.ones(1, dtype=torch.int64), prefix_lens=torch.zeros(1, dtype=torch.int64),
        extend_lens=torch.ones(1, dtype=torch.int64), logits_indices=torch.zeros(1, dtype=torch.int64),
        seq_lens_list=[1], prefix_lens_list=[0], extend_lens_list=[1],
    )  # fmt: skip
    assert TritonBackend.rotary_in_attention(object.__new__(TritonBackend), decode)
    assert not fib.FlashInferBackend.rotary_in_attention(object.__new__(fib.FlashInferBackend), decode)


@gpu
@needs_cuda
@pytest.mark.parametrize("bs", [1, 4])
def test_gpu_decode_through_forward_rotary(bs):
    """The model's entry point (rotary, KV store, attention) at small decode batches: FlashInfer's
    decode wrapper attends, and the result matches the torch rotary + torch-native attention."""
    pytest.importorskip("flashinfer")
    from types import SimpleNamespace

    from radixflow.kernels.reference import rotary_ref
    from radixflow.kernels.settings import DEFAULT_KERNEL_SETTINGS
    from radixflow.runtime.execution.layers.rotary import RotaryEmbedding

    heads = LLAMA3
    prefix = [300 + 7 * i for i in range(bs)]
    kw, ref_pool = _pool_and_table([p + 1 for p in prefix], heads, layers=1)
    backend = fib.FlashInferBackend(**kw)
    fb = _batch(kw["req_to_token"].table, prefix, [1] * bs)
    assert fb.mode == ForwardMode.DECODE
    fb.positions = fb.seq_lens - 1
    rotary = RotaryEmbedding(SimpleNamespace(rope_theta=500000.0), heads.d, 4096).to("cuda")
    rotary.kernels = DEFAULT_KERNEL_SETTINGS  # as the model sets it on CUDA
    q, k, v = _qkv(bs, heads)
    rq, rk = rotary_ref(fb.positions, q, k, rotary.cos, rotary.sin)
    backend.init_forward_metadata(fb)
    calls, run = [], backend._run
    backend._run = lambda *a: calls.append(a) or run(*a)
    got = backend.forward_rotary(fb.positions, q, k, v, rotary, 0, fb)
    assert calls, "FlashInfer's wrapper did not run"
    _close(got, _reference(ref_pool, kw, fb, rq, rk, v, 0), heads.tol)


@gpu
@needs_cuda
@pytest.mark.parametrize("shape", GRAPH_HEADS)
def test_gpu_cuda_graph_replans_for_each_replay(shape):
    """Captured with the runner's dummy batch (one token a row), replayed for real batches of
    other lengths and a smaller size (padded rows)."""
    pytest.importorskip("flashinfer")
    heads = GRAPH_HEADS[shape]
    kw, ref_pool = _pool_and_table([3000, 700, 40, 5], heads)
    backend = fib.FlashInferBackend(**kw)
    bs = 4
    static = _batch(kw["req_to_token"].table, [0] * bs, [1] * bs)
    static.mode, static.out_cache_loc = ForwardMode.DECODE, torch.zeros(bs, dtype=torch.int64, device="cuda")
    sq, sk, sv = _qkv(bs, heads)
    backend.init_cuda_graph_capture(static)
    backend.init_forward_metadata(static)  # keeps the graph plan
    backend.forward(sq, sk, sv, 0, static)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        backend.init_forward_metadata(static)
        out = backend.forward(sq, sk, sv, 0, static)
    for prefix in ([2999, 699, 39, 4], [10, 600, 1]):
        fb = _batch(kw["req_to_token"].table, prefix, [1] * len(prefix))
        n = fb.batch_size
        q, k, v = _qkv(n, heads)
        for dst, src in ((sq, q), (sk, k), (sv, v)):
            dst.zero_()
            dst[:n].copy_(src)
        static.out_cache_loc.zero_()
        static.out_cache_loc[:n].copy_(fb.out_cache_loc)
        backend.init_cuda_graph_replay(fb, bs)
        graph.replay()
        _close(out[:n], _reference(ref_pool, kw, fb, q, k, v, 0), heads.tol)
