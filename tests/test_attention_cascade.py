"""The torch-native backend's shared-prefix (cascade) path computes what the plain path does."""

from __future__ import annotations

import pytest
import torch

from radixflow.radix_cache.memory_pool import KVPool, ReqToTokenPool
from radixflow.runtime.execution.attention import torch_native
from radixflow.runtime.execution.attention.torch_native import TorchNativeBackend, shared_prefix_len
from radixflow.runtime.execution.forward_batch import ForwardBatch, ForwardMode

HQ, HKV, D = 6, 2, 16
SHARED = 40


def _setup(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    pool = KVPool(512, 1, 1, HKV, D, torch.float32, "cpu")
    pool.k[0].copy_(torch.randn(pool.k[0].shape, generator=g))
    pool.v[0].copy_(torch.randn(pool.v[0].shape, generator=g))
    table = ReqToTokenPool(4, 256, "cpu")
    shared = torch.arange(1, SHARED + 1)
    return g, pool, table, shared


def _batch(mode, table, shared, own_lens, new_lens, g):
    """Rows 0..B-1 start with `shared`, then own cached slots, then the pass's new slots."""
    next_slot, locs, pre_lens = 100, [], []
    for r, (own, new) in enumerate(zip(own_lens, new_lens)):
        own_slots = torch.arange(next_slot, next_slot + own)
        new_slots = torch.arange(next_slot + own, next_slot + own + new)
        next_slot += own + new
        row = torch.cat([shared, own_slots, new_slots])
        table.table[r, : row.numel()] = row.to(torch.int32)
        locs.append(new_slots)
        pre_lens.append(SHARED + own)
    seq = [p + n for p, n in zip(pre_lens, new_lens)]
    t = sum(new_lens)
    return ForwardBatch(
        mode=mode, input_ids=torch.zeros(t, dtype=torch.int64), positions=torch.zeros(t, dtype=torch.int64),
        out_cache_loc=torch.cat(locs), req_pool_indices=torch.arange(len(own_lens)), seq_lens=torch.tensor(seq),
        prefix_lens=torch.tensor(pre_lens), extend_lens=torch.tensor(new_lens), logits_indices=torch.arange(t),
        seq_lens_list=seq, prefix_lens_list=pre_lens, extend_lens_list=list(new_lens),
    )  # fmt: skip


def _run(backend, fb, q, k, v):
    backend.init_forward_metadata(fb)
    return backend.forward(q, k, v, 0, fb), fb.attn_metadata.shared


@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.EXTEND])
def test_cascade_matches_plain_attention(mode, monkeypatch):
    g, pool, table, shared = _setup()
    new = [1, 1, 1] if mode == ForwardMode.DECODE else [5, 3, 7]
    fb = _batch(mode, table, shared, own_lens=[3, 0, 11], new_lens=new, g=g)
    backend = TorchNativeBackend(pool, table, HQ, HKV, D)
    t = fb.num_tokens
    q, k, v = (torch.randn(t, h, D, generator=g) for h in (HQ, HKV, HKV))
    cascade, used = _run(backend, fb, q, k, v)
    assert used is not None and used.numel() == SHARED  # the shared prefix was found and read once
    monkeypatch.setattr(torch_native, "MIN_SHARED_PREFIX", 10**9)
    plain, unused = _run(backend, fb, q, k, v)
    assert unused is None
    torch.testing.assert_close(cascade, plain, atol=1e-5, rtol=1e-5)


def test_shared_prefix_len():
    rows = torch.tensor([[1, 2, 3, 4] * 10 + [5, 6], [1, 2, 3, 4] * 10 + [5, 7]])
    assert shared_prefix_len(rows, 42) == 41
    assert shared_prefix_len(rows, 40) == 40  # capped at the limit
    assert shared_prefix_len(rows[:1], 42) == 0  # one request: nothing to share
    assert shared_prefix_len(torch.stack([rows[0], rows[0] + 1]), 42) == 0



@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.EXTEND])
def test_deterministic_mode_attends_each_request_alone(mode):
    """With deterministic=True a request's output is the same bits alone or in a batch (no shared-prefix
    merge, no batch-wide padding), and still the plain path's attention."""
    g, pool, table, shared = _setup()
    new = [1, 1, 1] if mode == ForwardMode.DECODE else [5, 3, 7]
    fb = _batch(mode, table, shared, own_lens=[3, 0, 11], new_lens=new, g=g)
    q, k, v = (torch.randn(fb.num_tokens, h, D, generator=g) for h in (HQ, HKV, HKV))
    det = TorchNativeBackend(pool, table, HQ, HKV, D, deterministic=True)
    batched, used = _run(det, fb, q, k, v)
    assert used is None
    torch.testing.assert_close(batched, _run(TorchNativeBackend(pool, table, HQ, HKV, D), fb, q, k, v)[0],
                               atol=1e-5, rtol=1e-5)
    last = fb.num_tokens - new[-1]  # the third request alone: its table row and slots, no other request
    alone = ForwardBatch(
        mode=mode, input_ids=fb.input_ids[last:], positions=fb.positions[last:], out_cache_loc=fb.out_cache_loc[last:],
        req_pool_indices=fb.req_pool_indices[2:], seq_lens=fb.seq_lens[2:], prefix_lens=fb.prefix_lens[2:],
        extend_lens=fb.extend_lens[2:], logits_indices=torch.arange(new[-1]), seq_lens_list=fb.seq_lens_list[2:],
        prefix_lens_list=fb.prefix_lens_list[2:], extend_lens_list=fb.extend_lens_list[2:],
    )  # fmt: skip
    out, _ = _run(det, alone, q[last:], k[last:], v[last:])
    assert torch.equal(out, batched[last:])


@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.EXTEND])
def test_float64_attention_is_exact_through_the_cascade(mode, monkeypatch):
    """compute_dtype float64 (the exact-attention yardstick of benchmarks/gpu_bench.py): the cascade's
    shared-prefix merge and the plain path give the same float32 result to the last bit or so,
    where float32 attention leaves them ~3e-7 apart."""
    g, pool, table, shared = _setup()
    new = [1, 1, 1] if mode == ForwardMode.DECODE else [5, 3, 7]
    fb = _batch(mode, table, shared, own_lens=[3, 0, 11], new_lens=new, g=g)
    q, k, v = (torch.randn(fb.num_tokens, h, D, generator=g) for h in (HQ, HKV, HKV))
    backend = TorchNativeBackend(pool, table, HQ, HKV, D)
    results = {}
    for dtype in (torch.float32, torch.float64):
        backend.compute_dtype = dtype
        monkeypatch.setattr(torch_native, "MIN_SHARED_PREFIX", 32)
        cascade, used = _run(backend, fb, q, k, v)
        assert used is not None
        monkeypatch.setattr(torch_native, "MIN_SHARED_PREFIX", 10**9)
        results[dtype] = (cascade - _run(backend, fb, q, k, v)[0]).abs().max().item()
    assert results[torch.float64] <= 1.2e-7 < results[torch.float32], results
