"""DECODE_CONFIG's pool entries: which pools, batch sizes, shapes and devices the committed `bf16` and `fp8` entries
launch (and where an FP8 pool takes `fp8_fallback` instead; its shared-memory gate and the FP8 kernel's options:
tests/test_fp8_attention.py), that the kernel and the Triton backend run under the entry that applies, and that
the kernel under it matches the reference (on a GPU, the committed entries as the server resolves them).

Without CUDA the kernel runs in the interpreter at tiny shapes; the Llama-3-8B shapes run on a GPU only.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

import radixflow.kernels.decode_attention as da  # noqa: E402
from radixflow.kernels import reference as ref  # noqa: E402
from radixflow.kernels.fp8 import FP8  # noqa: E402
from test_fp8_attention import _device  # noqa: E402
from test_kernels import _paged_pool  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_cuda = pytest.mark.skipif(DEV != "cuda", reason="needs a CUDA device")
ENTRY = {"block_n": 32, "num_stages": 4, "waves": 64, "min_batch": 200}
LLAMA = {"head_dim": 128, "kv_heads": 8}  # the shape the committed `bf16` and `fp8` entries were timed at


def test_pool_kind_names_the_entry_a_pool_takes_and_refuses_other_dtypes():
    kinds = [da.pool_kind(t) for t in (torch.float8_e4m3fn, torch.bfloat16, torch.float16, torch.float32)]
    assert kinds == ["fp8", "bf16", "fp16", "float32"]
    for dtype in (torch.float8_e5m2, torch.int8, torch.float64):
        with pytest.raises(ValueError, match="no KV pool of"):
            da.pool_kind(dtype)


def test_pool_is_keyword_only_and_checked():
    """The pool kind is named, never positional (the old `fp8` flag would land there), and must be one of
    pool_kind's; left out, no pool entry applies."""
    with pytest.raises(TypeError):
        da.resolve_config(256, None, "bf16")
    with pytest.raises(TypeError):
        da.num_kv_splits(256, 8, 132, None, None, "bf16")
    for bad in ("fp17", "16bit", True):
        with pytest.raises(ValueError, match="pool"):
            da.resolve_config(256, pool=bad, **LLAMA)
    assert da.resolve_config(256, **LLAMA) == da.resolve_config(256, pool="float32", **LLAMA)


def test_bf16_entry_applies_to_bf16_pools_from_min_batch(monkeypatch):
    """A `bf16` entry launches a bf16 pool's batches from its min_batch up (and sets their split count), never an
    FP8, fp16 or float32 pool's; `small` wins at its batch sizes; a caller's empty `bf16` entry turns it off."""
    monkeypatch.setitem(da.DECODE_CONFIG, "bf16", ENTRY)
    got = da.resolve_config(256, pool="bf16")
    assert (got["block_n"], got["num_stages"], got["waves"]) == (32, 4, 64) and "min_batch" not in got
    assert da.resolve_config(256, pool="fp8", **LLAMA)["num_stages"] == da.DECODE_CONFIG["fp8"]["num_stages"]
    for batch, pool in ((256, "float32"), (256, "fp16"), (256, None), (199, "bf16"), (1, "bf16")):
        assert da.resolve_config(batch, pool=pool)["block_n"] == da.DECODE_CONFIG["block_n"], (batch, pool)
    assert da.resolve_config(256, {"bf16": {}}, pool="bf16")["block_n"] == da.DECODE_CONFIG["block_n"]
    assert da.num_kv_splits(256, 8, 132, pool="bf16") == 8 and da.num_kv_splits(256, 8, 132, pool="float32") == 1
    with pytest.raises(ValueError, match="bf16.blok_n"):
        da.resolve_config(256, {"bf16": {"blok_n": 32}}, pool="bf16")


@pytest.mark.parametrize("kind", ["bf16", "fp8"])  # the committed entries: 2 warps each, timed at one shape
@pytest.mark.parametrize("batch,pool,head_dim,kv_heads,applies", [
    (256, "own", 128, 8, True), (1024, "own", 128, 32, True),
    ("below", "own", 128, 8, False),  # one below the entry's min_batch
    (256, "own", 64, 8, False), (256, "own", 256, 8, False), (256, "own", None, 8, False),  # head sizes
    (256, "own", 128, 4, "fp8"), (512, "own", 128, 1, "fp8"), (256, "own", 128, None, False),  # TP ranks (fp8: timed)
    (256, "fp16", 128, 8, False), (256, "float32", 128, 8, False), (256, None, 128, 8, False),  # pools
])
def test_committed_entries_only_at_the_shapes_they_were_timed(monkeypatch, kind, batch, pool, head_dim, kv_heads,
                                                              applies):
    """A committed entry (`own`: its pool's) at an H200's shape and nowhere else, where an FP8 pool from batch 256
    takes `fp8_fallback` instead; the split count follows the same shape (num_kv_splits given decode_attention's
    arguments). The device is an H200's (sm_90) on any machine."""
    _device(monkeypatch, 9, 0, 232_448)
    pool = kind if pool == "own" else pool
    batch = da.DECODE_CONFIG[kind]["min_batch"] - 1 if batch == "below" else batch
    applies = applies is True or applies == kind  # a kind's name: that entry alone applies there
    got = da.resolve_config(batch, pool=pool, head_dim=head_dim, kv_heads=kv_heads)
    assert _launch(got) == _launch_at(batch, pool, kind if applies else None)
    assert "head_dim" not in got and "min_kv_heads" not in got and "min_shared_memory" not in got
    assert da.num_kv_splits(batch, kv_heads or 1, 132, pool=pool, head_dim=head_dim) == \
        da.num_kv_splits(batch, kv_heads or 1, 132, config=got)


@pytest.mark.parametrize("major,minor,applies", [
    (9, 0, True),  # H100 / H200: where it was timed
    (8, 0, False), (8, 6, False), (8, 9, False),  # A100, A10 / RTX 30x0, L4 / L40S / RTX 4090
    (10, 0, False), (12, 0, False),  # B200, RTX 5090: not timed
])
@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_committed_entries_only_on_the_gpus_they_were_timed_on(monkeypatch, major, minor, applies, kind):
    """Elsewhere an FP8 pool takes `fp8_fallback` (every device here allows 227 KiB of shared memory a block)."""
    _device(monkeypatch, major, minor, 232_448)
    got = da.resolve_config(512, pool=kind, **LLAMA)
    assert _launch(got) == _launch_at(512, kind, kind if applies else None)


def _launch(cfg: dict) -> tuple:
    return cfg["block_n"], cfg["num_warps"], cfg["num_stages"], cfg["fp8_exp2"], cfg["maxnreg"]


def _launch_at(batch: int, pool: str | None, entry: str | None) -> tuple:
    """The launch of DECODE_CONFIG's `entry` (its `large` launch from that one's min_batch up), or where None of
    `fp8_fallback` for an FP8 pool at its batch sizes (its device gate passing), else of the top level."""
    if entry is None and pool == "fp8" and batch >= da.DECODE_CONFIG["fp8_fallback"]["min_batch"]:
        entry = "fp8_fallback"
    own = dict(da.DECODE_CONFIG[entry]) if entry else {}
    large = own.pop("large", {})
    return _launch({**da.DECODE_CONFIG, **own, **(large if batch >= large.get("min_batch", batch + 1) else {})})


def test_fp8_entry_takes_its_large_launch_from_its_min_batch(monkeypatch):
    """The `fp8` entry's `large` launch from its own min_batch up and the entry's launch below it, the split count
    following; a caller's `fp8` entry without `large` has none (sweeps give whole launches); its keys are checked."""
    _device(monkeypatch, 9, 0, 232_448)
    entry = da.DECODE_CONFIG["fp8"]
    large = entry["large"]
    at, below = (da.resolve_config(b, pool="fp8", **LLAMA) for b in (large["min_batch"], large["min_batch"] - 1))
    assert all(at[k] == v for k, v in large.items() if k != "min_batch") and not {"large", "min_batch"} & set(at)
    assert (below["block_n"], below["num_warps"], below["maxnreg"]) == \
        (entry["block_n"], entry["num_warps"], entry.get("maxnreg", 0)) != (at["block_n"], at["num_warps"], at["maxnreg"])
    assert da.num_kv_splits(large["min_batch"], 8, 132, pool="fp8", head_dim=128) == \
        da.num_kv_splits(large["min_batch"], 8, 132, config=at)
    whole = {k: v for k, v in entry.items() if k != "large"}
    assert da.resolve_config(4096, {"fp8": whole}, pool="fp8", **LLAMA)["num_warps"] == entry["num_warps"]
    with pytest.raises(ValueError, match="fp8.large.blok_n"):
        da.resolve_config(512, {"fp8": {"large": {"min_batch": 1, "blok_n": 32}}}, pool="fp8")
    with pytest.raises(ValueError, match="small.large"):
        da.resolve_config(1, {"small": {"large": {}}})


def _spy_resolve(monkeypatch) -> list:
    """Every resolve_config call from here on: (its keyword arguments, what it returned)."""
    calls, real = [], da.resolve_config

    def spy(*args, **kw):
        got = real(*args, **kw)
        calls.append((kw, got))
        return got

    monkeypatch.setattr(da, "resolve_config", spy)
    return calls


# the interpreter computes bf16 wrongly (with any launch): its entry on a GPU only, the fp16 pool's on the CPU
@pytest.mark.parametrize("dtype", [torch.float16, pytest.param(torch.bfloat16, marks=needs_cuda)])
def test_decode_attention_runs_under_its_pool_entry_and_matches_reference(monkeypatch, dtype):
    """A 16-bit pool at a batch size and shape its entry covers launches the entry (here a 16-token block, more
    stages and a larger split count than the default launch: decode_attention resolves it with the pool's kind,
    head size and KV heads) and matches the float32 reference, at its own split count and one."""
    kind = da.pool_kind(dtype)
    seq_lens, hq, hkv, d = [70, 7, 1, 130], 8, 2, 16
    monkeypatch.setitem(da.DECODE_CONFIG, kind, {**ENTRY, "block_n": 16, "min_batch": 3, "head_dim": d,
                                                  "min_kv_heads": hkv})
    k, v, table, req_idx = _paged_pool(seq_lens, hkv, d, dtype)
    q = torch.randn(len(seq_lens), hq, d, device=DEV).to(dtype)
    lens = torch.tensor(seq_lens, device=DEV)
    want = ref.decode_attention_ref(q.float(), k.float(), v.float(), table, req_idx, lens, 0.25)
    calls = _spy_resolve(monkeypatch)
    for splits in (1, da.num_kv_splits(len(seq_lens), hkv, 8, pool=kind, head_dim=d)):
        calls.clear()
        got = da.decode_attention(q, k, v, table, req_idx, lens, 0.25, splits)
        torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)
        assert [(kw, cfg["block_n"]) for kw, cfg in calls] == [(dict(pool=kind, head_dim=d, kv_heads=hkv), 16)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float32])
def test_triton_backend_plans_decode_splits_with_its_pools_entry(monkeypatch, dtype):
    """The Triton backend's decode split count comes from its pool's entry at its head size: an entry that sets
    `waves` (and is gated on the head size) changes it for that pool kind; a float32 pool has no entry."""
    from radixflow.radix_cache.memory_pool import KVPool, ReqToTokenPool
    from radixflow.runtime.execution.attention.triton_backend import TritonBackend
    from radixflow.runtime.execution.forward_batch import ForwardMode

    kind = da.pool_kind(dtype)
    backend = TritonBackend(kv_pool=KVPool(64, 1, 1, 2, 16, dtype, DEV), req_to_token=ReqToTokenPool(2, 32, DEV),
                            num_q_heads=4, num_kv_heads=2, head_dim=16)
    backend.num_sms = 8  # the CPU's stand-in on a GPU too: a GPU's 132 SMs put both counts at max_splits
    fb = SimpleNamespace(mode=ForwardMode.DECODE, batch_size=4)
    backend.init_forward_metadata(fb)
    plain = fb.attn_metadata
    if kind in da.POOL_ENTRIES:
        monkeypatch.setitem(da.DECODE_CONFIG, kind, {"waves": 64, "min_batch": 2, "head_dim": 16})
    backend.init_forward_metadata(fb)
    assert fb.attn_metadata == da.num_kv_splits(4, 2, backend.num_sms, pool=kind, head_dim=16)
    assert (fb.attn_metadata > plain) == (kind != "float32"), (plain, fb.attn_metadata)


@pytest.mark.skipif(DEV != "cuda", reason="Llama-3-8B heads at batch 256: too slow for the CPU interpreter")
def test_gpu_bf16_entry_llama_shapes():
    """DECODE_CONFIG's `bf16` entry as committed, at Llama-3-8B heads (8 KV heads of 128, groups of 4) and a batch
    it covers, lengths 1 to 1,500: at its own split count, one and 16 against the float32 reference."""
    seq_lens = torch.randint(1, 1500, (256,), generator=torch.Generator().manual_seed(0)).tolist()
    if torch.cuda.get_device_capability()[0] == da.DECODE_CONFIG["bf16"].get("sm_major", 9):
        assert da.resolve_config(256, pool="bf16", **LLAMA) != da.resolve_config(256, **LLAMA)  # the entry applies
    k, v, table, req_idx = _paged_pool(seq_lens, 8, 128, torch.bfloat16, rows=len(seq_lens) + 1)
    q = torch.randn(len(seq_lens), 32, 128, device=DEV, dtype=torch.bfloat16)
    lens = torch.tensor(seq_lens, device=DEV)
    want = ref.decode_attention_ref(q.float(), k.float(), v.float(), table, req_idx, lens, 128**-0.5)
    for splits in sorted({1, da.num_kv_splits(len(seq_lens), 8, pool="bf16", head_dim=128), 16}):
        got = da.decode_attention(q, k, v, table, req_idx, lens, 128**-0.5, splits)
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(DEV != "cuda", reason="Llama-3-8B heads at batch 256: too slow for the CPU interpreter")
@pytest.mark.parametrize("kv_heads", [8, 4, 1])  # Llama-3-8B whole, TP2 / TP8 ranks (all the `fp8` entry since session 12)
@pytest.mark.parametrize("batch", [256, 512])  # the entry's own launch, its `large` one
def test_gpu_fp8_entry_llama_shapes(kv_heads, batch):
    """DECODE_CONFIG's `fp8` entry (or at fewer KV heads `fp8_fallback`) as the server resolves it (config None, the
    pool's head size and KV heads), at Llama-3-8B heads (128-dim, 4 query heads a KV head, per-head scales) and
    batch 256 and 512, lengths 1 to 1,500: at its own split count, one and 16 against the float32 reference over
    the dequantized pool."""
    seq_lens = torch.randint(1, 1500, (batch,), generator=torch.Generator().manual_seed(0)).tolist()
    shape = {"head_dim": 128, "kv_heads": kv_heads}
    if torch.cuda.get_device_capability()[0] == da.DECODE_CONFIG["fp8"].get("sm_major", 9):  # the entry applies
        assert _launch(da.resolve_config(batch, pool="fp8", **shape)) == \
            _launch_at(batch, "fp8", "fp8" if kv_heads >= da.DECODE_CONFIG["fp8"]["min_kv_heads"] else None)
    k, v, table, req_idx = _paged_pool(seq_lens, kv_heads, 128, torch.float32, rows=len(seq_lens) + 1)
    scales = tuple(torch.rand(kv_heads, device=DEV) + 0.05 for _ in range(2))
    k8, v8 = ((t / s[:, None]).to(FP8) for t, s in zip((k, v), scales))
    deq = [t.float() * s[:, None] for t, s in zip((k8, v8), scales)]
    q = torch.randn(len(seq_lens), 4 * kv_heads, 128, device=DEV, dtype=torch.bfloat16)
    lens = torch.tensor(seq_lens, device=DEV)
    want = ref.decode_attention_ref(q.float(), *deq, table, req_idx, lens, 128**-0.5)
    for splits in sorted({1, da.num_kv_splits(len(seq_lens), kv_heads, pool="fp8", head_dim=128), 16}):
        got = da.decode_attention(q, k8, v8, table, req_idx, lens, 128**-0.5, splits, scales=scales)
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
