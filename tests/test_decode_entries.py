"""DECODE_CONFIG's `bf16` entry: which pools and batch sizes it launches, on which devices, and that the
kernel under it matches the reference (the FP8 pool's `fp8` entry: tests/test_fp8_attention.py).

Without CUDA the kernel runs in the interpreter at tiny shapes; the Llama-3-8B shapes run on a GPU only.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

import radixflow.kernels.decode_attention as da  # noqa: E402
from radixflow.kernels import reference as ref  # noqa: E402
from test_fp8_attention import _device  # noqa: E402
from test_kernels import _paged_pool  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_cuda = pytest.mark.skipif(DEV != "cuda", reason="needs a CUDA device")
ENTRY = {"block_n": 32, "num_stages": 4, "waves": 64, "min_batch": 200, "min_shared_memory": 150_000}


def test_pool_kind_names_the_entry_a_pool_takes():
    assert [da.pool_kind(t) for t in (torch.float8_e4m3fn, torch.bfloat16, torch.float16, torch.float32)] == \
        ["fp8", "bf16", "bf16", "float32"]


def test_bf16_entry_applies_to_16_bit_pools_from_min_batch(monkeypatch):
    """The `bf16` entry launches a 16-bit pool's batches from its min_batch up (and sets their split count), never
    an FP8 or float32 pool's; `small` wins at its batch sizes; a caller's empty `bf16` entry turns it off."""
    monkeypatch.setitem(da.DECODE_CONFIG, "bf16", ENTRY)
    got = da.resolve_config(256)
    assert (got["block_n"], got["num_stages"], got["waves"]) == (32, 4, 64) and "min_batch" not in got
    assert da.resolve_config(256, pool="fp8")["block_n"] == da.DECODE_CONFIG["fp8"]["block_n"]
    for batch, pool in ((256, "float32"), (199, "bf16"), (1, "bf16")):
        assert da.resolve_config(batch, pool=pool)["block_n"] == da.DECODE_CONFIG["block_n"], (batch, pool)
    assert da.resolve_config(256, {"bf16": {}})["block_n"] == da.DECODE_CONFIG["block_n"]
    assert da.num_kv_splits(256, 8, 132) == 8 and da.num_kv_splits(256, 8, 132, pool="float32") == 1
    with pytest.raises(ValueError, match="bf16.blok_n"):
        da.resolve_config(256, {"bf16": {"blok_n": 32}})


@pytest.mark.parametrize("major,minor,optin,fits", [
    (9, 0, 232_448, True), (10, 0, 232_448, True), (8, 9, 101_376, False), (12, 0, 101_376, False),
    (9, 0, None, True), (8, 9, None, False),
])
def test_bf16_entry_only_where_the_device_holds_its_shared_memory(monkeypatch, major, minor, optin, fits):
    monkeypatch.setitem(da.DECODE_CONFIG, "bf16", ENTRY)
    _device(monkeypatch, major, minor, optin)
    got = da.resolve_config(512)
    assert got["block_n"] == (ENTRY["block_n"] if fits else da.DECODE_CONFIG["block_n"])
    assert da.num_kv_splits(512, 8, 132) == da.num_kv_splits(512, 8, 132, config=got)


# the interpreter computes bf16 wrongly (with any launch): bf16 on a GPU only
@pytest.mark.parametrize("dtype", [torch.float16, pytest.param(torch.bfloat16, marks=needs_cuda)])
def test_decode_attention_under_the_bf16_entry_matches_reference(monkeypatch, dtype):
    """A 16-bit pool at a batch size the entry covers runs its launch (here a 16-token block, more stages and a
    larger split count than the default launch) and matches the float32 reference, at its own split count and one."""
    monkeypatch.setitem(da.DECODE_CONFIG, "bf16", {**ENTRY, "block_n": 16, "min_batch": 3, "min_shared_memory": 0})
    seq_lens, hq, hkv, d = [70, 7, 1, 130], 8, 2, 16
    k, v, table, req_idx = _paged_pool(seq_lens, hkv, d, dtype)
    q = torch.randn(len(seq_lens), hq, d, device=DEV).to(dtype)
    lens = torch.tensor(seq_lens, device=DEV)
    want = ref.decode_attention_ref(q.float(), k.float(), v.float(), table, req_idx, lens, 0.25)
    assert da.resolve_config(len(seq_lens))["block_n"] == 16
    for splits in (1, da.num_kv_splits(len(seq_lens), hkv, 8)):
        got = da.decode_attention(q, k, v, table, req_idx, lens, 0.25, splits)
        torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)


@pytest.mark.skipif(DEV != "cuda", reason="Llama-3-8B heads at batch 256: too slow for the CPU interpreter")
def test_gpu_bf16_entry_llama_shapes():
    """DECODE_CONFIG's `bf16` entry as committed, at Llama-3-8B heads (8 KV heads of 128, groups of 4) and a batch
    it covers, lengths 1 to 1,500: at its own split count, one and 16 against the float32 reference."""
    seq_lens = torch.randint(1, 1500, (256,), generator=torch.Generator().manual_seed(0)).tolist()
    assert da.resolve_config(len(seq_lens)) != da.resolve_config(len(seq_lens), pool="float32")  # the entry applies
    k, v, table, req_idx = _paged_pool(seq_lens, 8, 128, torch.bfloat16, rows=len(seq_lens) + 1)
    q = torch.randn(len(seq_lens), 32, 128, device=DEV, dtype=torch.bfloat16)
    lens = torch.tensor(seq_lens, device=DEV)
    want = ref.decode_attention_ref(q.float(), k.float(), v.float(), table, req_idx, lens, 128**-0.5)
    for splits in sorted({1, da.num_kv_splits(len(seq_lens), 8), 16}):
        got = da.decode_attention(q, k, v, table, req_idx, lens, 128**-0.5, splits)
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
