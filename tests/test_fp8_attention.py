"""An FP8 (e4m3) KV pool's attention: the Triton KV store, the decode and extend kernels (and the decode loop's
options) against the float32 reference over the dequantized pool, and how DECODE_CONFIG's FP8 entries are chosen:
from a batch size, `fp8_fallback` only where the device holds its shared memory, a caller's config over both (the
`fp8` entry's shape and GPU gates: tests/test_decode_entries.py).

Without CUDA the kernels run in the interpreter at tiny shapes; the Llama-3-8B shapes run on a GPU only.
"""

from __future__ import annotations

import functools

import os
from types import SimpleNamespace

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

import radixflow.kernels.decode_attention as da  # noqa: E402
import radixflow.kernels.decode_config as dc  # noqa: E402
from radixflow.kernels import reference as ref  # noqa: E402
from radixflow.kernels.fp8 import FP8  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _fp8_pool(seq_lens: list, hkv: int, d: int):
    """test_kernels' scattered pool in FP8 with per-head scales, and the same values dequantized (float32)."""
    from test_kernels import _paged_pool

    k, v, table, req_idx = _paged_pool(seq_lens, hkv, d, torch.float32)
    k_scale = torch.tensor([0.5, 2.0][:hkv], device=DEV)
    v_scale = torch.tensor([0.25, 1.5][:hkv], device=DEV)
    k8, v8 = (k / k_scale[:, None]).to(FP8), (v / v_scale[:, None]).to(FP8)
    deq = (k8.float() * k_scale[:, None], v8.float() * v_scale[:, None])
    return (k8, v8), (k_scale, v_scale), deq, table, req_idx


def test_fp8_kv_store_matches_the_pool_store():
    """The Triton KV store and KVPool.store (torch-native's) write the same e4m3 bytes: x / scale per head."""
    from radixflow.kernels.kv_store import store_kv
    from radixflow.radix_cache.memory_pool import KVPool

    pool = KVPool(32, 1, 1, 2, 16, FP8, DEV)
    pool.set_scales(0, torch.tensor([0.5, 2.0]), torch.tensor([0.25, 1.5]))
    k, v = torch.randn(5, 2, 16, device=DEV) * 3, torch.randn(5, 2, 16, device=DEV)
    loc = torch.tensor([3, 9, 4, 17, 30], device=DEV)
    pool.store(0, loc, k, v)
    k_buf, v_buf = torch.zeros_like(pool.k[0]), torch.zeros_like(pool.v[0])
    store_kv(k_buf, v_buf, loc, k, v, (pool.k_scale[0], pool.v_scale[0]))
    assert torch.equal(k_buf.view(torch.uint8), pool.k[0].view(torch.uint8))
    assert torch.equal(v_buf.view(torch.uint8), pool.v[0].view(torch.uint8))
    back = pool.k[0][loc].float() * pool.k_scale[0][:, None]
    assert ((back - k).abs() <= k.abs() * 2**-4 + 2**-9).all()  # e4m3's rounding, relative to the scaled value


@pytest.mark.parametrize("splits", [1, 4])
def test_fp8_kv_decode_and_extend_attention_match_dequantized_reference(splits):
    from radixflow.kernels.decode_attention import decode_attention
    from radixflow.kernels.extend_attention import extend_attention

    seq_lens, hq, hkv, d = [70, 7, 1], 6, 2, 16
    bufs, scales, deq, table, req_idx = _fp8_pool(seq_lens, hkv, d)
    q = torch.randn(len(seq_lens), hq, d, device=DEV)
    lens = torch.tensor(seq_lens, device=DEV)
    got = decode_attention(q, *bufs, table, req_idx, lens, 0.25, splits, scales=scales)
    torch.testing.assert_close(got, ref.decode_attention_ref(q, *deq, table, req_idx, lens, 0.25), rtol=1e-4, atol=1e-4)
    if splits == 1:
        prefix, extend = [10, 0, 1], [60, 7, 0]
        qe = torch.randn(sum(extend), hq, d, device=DEV)
        pre, ext = torch.tensor(prefix, device=DEV), torch.tensor(extend, device=DEV)
        starts = torch.tensor([0, 60, 67], device=DEV)
        got = extend_attention(qe, *bufs, table, req_idx, pre, ext, starts, max(extend), 0.25, scales=scales)
        want = ref.extend_attention_ref(qe, *deq, table, req_idx, pre, ext, 0.25)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("magnitude", [1e-3, 1.0, 1e5])  # 1e5: past float16's range unless q is rescaled
@pytest.mark.parametrize("f16", [True, False])  # K / V widened to float16 (the default) or to q's bf16
def test_fp8_kv_attention_with_bf16_queries(magnitude, f16):
    """bf16 queries over an FP8 pool: the products run in float16 with q rescaled by a power of two
    (attention_common.as_f16_pow2), so q of any magnitude gives what the dequantized reference gives."""
    from radixflow.kernels.decode_attention import decode_attention
    from radixflow.kernels.extend_attention import extend_attention

    if not f16 and DEV != "cuda":
        pytest.skip("Triton's CPU interpreter gets e4m3 -> bf16 products wrong (1e9 off); the GPU does not")
    seq_lens, hq, hkv, d = [70, 7, 1], 6, 2, 16
    bufs, scales, deq, table, req_idx = _fp8_pool(seq_lens, hkv, d)
    q = (torch.randn(len(seq_lens), hq, d, device=DEV) * magnitude).to(torch.bfloat16)
    lens, scale = torch.tensor(seq_lens, device=DEV), 0.25 / magnitude
    got = decode_attention(q, *bufs, table, req_idx, lens, scale, 4, scales=scales, config={"fp8_f16": f16})
    want = ref.decode_attention_ref(q.float(), *deq, table, req_idx, lens, scale)
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)
    prefix, extend = [10, 0, 1], [60, 7, 0]
    qe = (torch.randn(sum(extend), hq, d, device=DEV) * magnitude).to(torch.bfloat16)
    pre, ext = torch.tensor(prefix, device=DEV), torch.tensor(extend, device=DEV)
    starts = torch.tensor([0, 60, 67], device=DEV)
    got = extend_attention(qe, *bufs, table, req_idx, pre, ext, starts, max(extend), scale, scales=scales)
    want = ref.extend_attention_ref(qe.float(), *deq, table, req_idx, pre, ext, scale)
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("v_regs", [True, False])
def test_fp8_kv_decode_v_widened_in_registers_or_after_shared_memory(v_regs):
    """decode_attention's two places for an FP8 pool's V conversion (`fp8_v_regs`: inline PTX in registers,
    or where Triton puts it) with bf16 queries, at the bf16 launch's 64-token blocks and at 128-token blocks
    through a caller's `fp8` entry, against the dequantized reference. On the CPU both values of v_regs run
    the same code (the interpreter casts): the parametrisation means something on a GPU only."""
    seq_lens, hq, hkv, d = [70, 7, 1, 130], 8, 2, 16
    bufs, scales, deq, table, req_idx = _fp8_pool(seq_lens, hkv, d)
    q = torch.randn(len(seq_lens), hq, d, device=DEV).to(torch.bfloat16)
    lens = torch.tensor(seq_lens, device=DEV)
    want = ref.decode_attention_ref(q.float(), *deq, table, req_idx, lens, 0.25)
    for config in ({"fp8_v_regs": v_regs}, {"fp8_v_regs": v_regs, "fp8": {"block_n": 128, "num_warps": 8}}):
        assert da.resolve_config(len(seq_lens), config, pool="fp8")["block_n"] == config.get("fp8", {}).get("block_n", 64)
        for splits in (1, 4):
            got = da.decode_attention(q, *bufs, table, req_idx, lens, 0.25, splits, scales=scales, config=config)
            torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)


# block_n, num_warps (64 / 2: the `fp8` entry's; 32 / 1: its `large` launch's, without the register cap)
@pytest.mark.parametrize("launch", [(64, 4), (128, 4), (64, 2), (32, 1)])
def test_fp8_kv_decode_scores_in_log2_units(launch):
    """Scores in log2 units (fp8_exp2, issue 28 session 11) give the dequantized reference's output with bf16
    queries, at 1 and 4 splits (4: the partials' log-sum-exp, which exp2 keeps in natural-log units: without
    the conversion back this fails), sequences ending inside a block included; scale 2 spreads the scores."""
    seq_lens, hq, hkv, d = [70, 7, 1, 130], 8, 2, 16
    bufs, scales, deq, table, req_idx = _fp8_pool(seq_lens, hkv, d)
    q = torch.randn(len(seq_lens), hq, d, device=DEV).to(torch.bfloat16)
    lens = torch.tensor(seq_lens, device=DEV)
    want = ref.decode_attention_ref(q.float(), *deq, table, req_idx, lens, 2.0)
    config = {"fp8_exp2": True, "fp8": {"block_n": launch[0], "num_warps": launch[1]}}
    for splits in (1, 4):
        got = da.decode_attention(q, *bufs, table, req_idx, lens, 2.0, splits, scales=scales, config=config)
        torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)


# Launches of an FP8 pool besides DECODE_CONFIG's at the test's batch sizes: the bf16 launch with V widened
# after shared memory or in registers, DECODE_CONFIG's `fp8` and `fp8_fallback` entries below their min_batch, others
GPU_FP8_DECODE_VARIANTS = [{"fp8_v_regs": False}, {"fp8": {}}, {"fp8": {**da.DECODE_CONFIG["fp8"], "min_batch": 0}},
                           {"fp8": {**da.DECODE_CONFIG["fp8_fallback"], "min_batch": 0}},
                           {"fp8": {"block_n": 128, "num_warps": 8, "num_stages": 2}},
                           {"fp8": {"block_n": 32, "num_warps": 4, "num_stages": 5}},
                           {"fp8": {"block_n": 32, "num_warps": 1, "num_stages": 5, "maxnreg": 168}}]


@pytest.mark.skipif(DEV != "cuda", reason="Llama-3-8B heads: too slow for the CPU interpreter")
@pytest.mark.parametrize("seq_lens", [[4097], [1, 200, 4097, 33], [130] * 64])  # [4097]: the batch-1 (`small`) launch
def test_gpu_fp8_kv_decode_attention_llama_shapes(seq_lens):
    """An FP8 pool at Llama-3-8B heads (8 KV heads of 128, groups of 4), bf16 queries, per-head scales, through
    DECODE_CONFIG and each variant at 1, the tuned and 16 splits, against the float32 reference over the
    dequantized pool."""
    from test_kernels import _paged_pool

    k, v, table, req_idx = _paged_pool(seq_lens, 8, 128, torch.float32, rows=len(seq_lens) + 1)
    scales = tuple(torch.rand(8, device=DEV) + 0.05 for _ in range(2))
    k8, v8 = ((t / s[:, None]).to(FP8) for t, s in zip((k, v), scales))
    deq = [t.float() * s[:, None] for t, s in zip((k8, v8), scales)]
    q = torch.randn(len(seq_lens), 32, 128, device=DEV, dtype=torch.bfloat16)
    lens = torch.tensor(seq_lens, device=DEV)
    want = ref.decode_attention_ref(q.float(), *deq, table, req_idx, lens, 128**-0.5)
    for splits in sorted({1, da.num_kv_splits(len(seq_lens), 8, pool="fp8", head_dim=128), 16}):
        for config in [None] + GPU_FP8_DECODE_VARIANTS:
            got = da.decode_attention(q, k8, v8, table, req_idx, lens, 128**-0.5, splits, config=config, scales=scales)
            torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


# -- which launch an FP8 pool gets ----------------------------------------------------------------
def test_decode_config_fp8_entry_applies_to_fp8_pools_from_min_batch(monkeypatch):
    """DECODE_CONFIG's `fp8` entry launches an FP8 pool's batches from its min_batch up (and their split
    count), never a 16-bit pool's, and `small` wins at its batch sizes."""
    monkeypatch.setitem(da.DECODE_CONFIG, "fp8", {"block_n": 128, "waves": 64, "min_batch": 200})
    fp8, bf16 = da.resolve_config(256, pool="fp8"), da.resolve_config(256)
    assert (fp8["block_n"], bf16["block_n"]) == (128, da.DECODE_CONFIG["block_n"]) and "fp8" not in fp8
    assert "min_batch" not in fp8 and da.resolve_config(199, pool="fp8")["block_n"] == da.DECODE_CONFIG["block_n"]
    assert da.resolve_config(1, pool="fp8")["block_n"] == da.DECODE_CONFIG["block_n"]  # `small` applies
    assert da.resolve_config(256, {"fp8": {}}, pool="fp8")["block_n"] == da.DECODE_CONFIG["block_n"]
    assert da.num_kv_splits(256, 8, 132, pool="fp8") == 8 and da.num_kv_splits(256, 8, 132) == 1


def _device(monkeypatch, major: int, minor: int, optin: int | None) -> None:
    """A CUDA device with these properties as far as entry_fits can tell (no GPU needed)."""
    props = SimpleNamespace(major=major, minor=minor)
    if optin is not None:
        props.shared_memory_per_block_optin = optin
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    # a fresh per-device cache for this fake device, the real one restored afterwards
    monkeypatch.setattr(dc, "_device_limits", functools.lru_cache(dc._device_limits.__wrapped__))


@pytest.mark.parametrize("major,minor,optin,fits", [
    (9, 0, 232_448, True),  # H100 / H200
    (10, 0, 232_448, True),  # B200
    (8, 9, 101_376, False),  # L4, L40S, RTX 4090: the 5-stage 128-token launch would not launch
    (12, 0, 101_376, False),  # RTX 5090: a newer capability with an sm_89-sized limit
    (9, 0, None, True), (8, 9, None, False),  # a torch without the property: by compute capability
])
def test_fp8_fallback_only_where_the_device_holds_its_shared_memory(monkeypatch, major, minor, optin, fits):
    """`fp8_fallback` (128-token blocks, 4 warps, 5 stages: the `fp8` entry before issue 28's session 11) where the
    `fp8` entry's gates fail (here 64-dim heads), only where a block may have its min_shared_memory."""
    _device(monkeypatch, major, minor, optin)
    entry = da.DECODE_CONFIG["fp8_fallback"]
    assert da.entry_fits(entry) == fits
    got = da.resolve_config(512, pool="fp8", head_dim=64, kv_heads=8)
    assert (got["block_n"], got["num_stages"]) == ((entry["block_n"], entry["num_stages"]) if fits else
                                                   (da.DECODE_CONFIG["block_n"], da.DECODE_CONFIG["num_stages"]))
    assert da.num_kv_splits(512, 8, 132, pool="fp8", head_dim=64) == da.num_kv_splits(512, 8, 132, config=got)


def test_callers_config_wins_over_the_fp8_entry_and_nested_keys_are_checked():
    """A caller's top-level keys beat DECODE_CONFIG's `fp8` / `fp8_fallback` entries; the caller's own `fp8` entry
    beats them; a misspelt key inside `small` or a pool entry is refused like a top-level one."""
    got = da.resolve_config(256, {"block_n": 32, "num_stages": 2}, pool="fp8")
    assert (got["block_n"], got["num_stages"]) == (32, 2)
    for head_dim, name in ((128, "fp8"), (64, "fp8_fallback")):  # the caller's key over either entry's launch
        got, entry = da.resolve_config(256, {"fp8_f16": False}, pool="fp8", head_dim=head_dim, kv_heads=8), \
            da.DECODE_CONFIG[name]
        assert (got["block_n"], got["num_warps"], got["num_stages"], got["fp8_f16"]) == \
            (entry["block_n"], entry["num_warps"], entry["num_stages"], False)
    got = da.resolve_config(8, {"block_n": 32, "fp8": {"block_n": 16}}, pool="fp8")
    assert got["block_n"] == 16 and da.resolve_config(8, {"block_n": 32, "fp8": {"block_n": 16}})["block_n"] == 32
    for bad, key in (({"fp8": {"blok_n": 32}}, "fp8.blok_n"), ({"small": {"max_bach": 1}}, "small.max_bach"),
                     ({"small": {"min_batch": 1}}, "small.min_batch"), ({"fp8": {"fp8": {}}}, "fp8.fp8"),
                     ({"fp8_fallback": {"blok_n": 32}}, "fp8_fallback.blok_n")):
        with pytest.raises(ValueError, match=key):
            da.resolve_config(256, bad, pool="fp8")
