"""Prompt-only prefill rows through torch's variable-length flash kernel (kernels/flash_varlen.py):
which rows of an extend batch take which kernel, the fallback where the op is missing, and (on a GPU)
the result against the torch-native backend."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from radixflow.kernels.flash_varlen import flash_varlen_supported
from radixflow.radix_cache.memory_pool import KVPool, ReqToTokenPool
from radixflow.runtime.execution.attention import triton_backend as tb
from radixflow.runtime.execution.attention.triton_backend import TritonBackend, cached_rows, takes_flash
from radixflow.runtime.execution.forward_batch import ForwardBatch, ForwardMode
from radixflow.runtime.server_args import ServerArgs

HQ, HKV, D = 4, 2, 16


def _extend_batch(table: ReqToTokenPool, prefix: list[int], new: list[int], device: str) -> ForwardBatch:
    """Row r: `prefix[r]` cached slots then `new[r]` new ones, slots numbered from 1 in row order."""
    slot, locs = 1, []
    for r, (p, n) in enumerate(zip(prefix, new)):
        table.table[r, : p + n] = torch.arange(slot, slot + p + n, dtype=torch.int32)
        locs.append(torch.arange(slot + p, slot + p + n))
        slot += p + n
    seq = [p + n for p, n in zip(prefix, new)]
    t = sum(new)
    as_t = lambda xs: torch.tensor(xs, device=device)  # noqa: E731
    return ForwardBatch(
        mode=ForwardMode.EXTEND, input_ids=torch.zeros(t, dtype=torch.int64, device=device),
        positions=torch.cat([torch.arange(p, p + n) for p, n in zip(prefix, new)]).to(device),
        out_cache_loc=torch.cat(locs).to(device), req_pool_indices=as_t(list(range(len(new)))), seq_lens=as_t(seq),
        prefix_lens=as_t(prefix), extend_lens=as_t(new), logits_indices=torch.arange(t, device=device),
        seq_lens_list=seq, prefix_lens_list=list(prefix), extend_lens_list=list(new),
    )  # fmt: skip


def _backend(device: str, dtype: torch.dtype, **kw) -> TritonBackend:
    """A one-layer backend over a 2,048-slot pool of `dtype` (8 rows of 1,024 tokens)."""
    pool = KVPool(2048, 1, 1, HKV, D, dtype, device)
    return TritonBackend(kv_pool=pool, req_to_token=ReqToTokenPool(8, 1024, device), num_q_heads=HQ,
                         num_kv_heads=HKV, head_dim=D, **kw)


def test_row_split():
    """Flash runs when the prompt-only rows carry at least as many new tokens as the rows with a cached
    prefix, which the Triton kernel computes again (a chunked prompt's later chunk beside a few short
    fresh prompts: the Triton kernel alone)."""
    assert cached_rows([0, 12, 0, 3]) == [1, 3]
    assert takes_flash([7], []) and takes_flash([5, 3], [1]) and takes_flash([4, 4], [1])
    assert not takes_flash([3, 5], [1])  # 3 fresh tokens against 5 computed twice
    assert not takes_flash([2048, 30, 40], [0])  # a chunk's remainder first, short fresh prompts after
    assert not takes_flash([5, 12], [0, 1])  # every row has a prefix


def test_plan_takes_no_flash_when_the_settings_turn_it_off(monkeypatch):
    """A 16-bit pool on a device with the op, the flash path off in the settings (--disable-flash-prefill):
    the Triton kernel for every row."""
    monkeypatch.setattr(tb, "flash_varlen_supported", lambda *a: True)
    backend = _backend("cpu", torch.bfloat16)
    backend.settings = dataclasses.replace(backend.settings, flash_prefill=False)
    fb = _extend_batch(backend.req_to_token, [0, 0], [5, 5], "cpu")
    backend.init_forward_metadata(fb)
    assert fb.attn_metadata.flash_cu is None


def test_flash_off_where_the_op_is_missing_and_under_deterministic_inference():
    assert not flash_varlen_supported("cpu", HQ, HKV, D)
    backend = _backend("cpu", torch.bfloat16)
    assert not backend.flash_ok and not backend.flash_enabled()
    assert ServerArgs().kernel_settings().flash_prefill
    assert not ServerArgs(disable_flash_prefill=True).kernel_settings().flash_prefill
    assert not ServerArgs(enable_deterministic_inference=True).kernel_settings().flash_prefill


def test_flash_only_for_16_bit_pools_and_never_when_deterministic(monkeypatch):
    """Where the op runs: a float32 pool (the kernel takes 16-bit inputs), an FP8 pool (prompt-only rows would
    skip the e4m3 rounding of the rows read back from it) and deterministic inference keep the Triton kernel,
    whatever the settings say."""
    monkeypatch.setattr(tb, "flash_varlen_supported", lambda *a: True)
    assert _backend("cpu", torch.bfloat16).flash_enabled() and _backend("cpu", torch.float16).flash_enabled()
    for backend in (_backend("cpu", torch.float32), _backend("cpu", torch.float8_e4m3fn),
                    _backend("cpu", torch.bfloat16, deterministic=True)):
        backend.settings = dataclasses.replace(backend.settings, flash_prefill=True)
        assert not backend.flash_enabled()
        fb = _extend_batch(backend.req_to_token, [0, 0], [5, 3], "cpu")
        backend.init_forward_metadata(fb)
        assert fb.attn_metadata.flash_cu is None


def test_plan_sends_prompt_only_rows_to_flash_and_cached_rows_to_triton(monkeypatch):
    """With both kernels replaced by markers: flash writes 1 everywhere, the Triton kernel 2 on the rows it
    is given (3 elsewhere when it allocates the output); each token must carry its row's kernel."""
    def fake_flash(q, k, v, cu, max_len, scale):
        assert cu.dtype == torch.int32 and cu.tolist() == [0, 5, 8, 15, 16] and max_len == 7
        return torch.ones_like(q)

    def fake_extend(q, k_buf, v_buf, table, req_idx, prefix, ext, q_start, max_ext, scale, out=None, **kw):
        out = torch.full_like(q, 3.0) if out is None else out
        for s, n in zip(q_start.tolist(), ext.tolist()):
            out[s : s + n] = 2.0
        return out

    stored = []
    monkeypatch.setattr(tb, "flash_varlen_attention", fake_flash)
    monkeypatch.setattr(tb, "extend_attention", fake_extend)
    monkeypatch.setattr(tb, "store_kv", lambda k_buf, v_buf, loc, k, v, *a, **kw: stored.append(loc.tolist()))
    monkeypatch.setattr(tb, "flash_varlen_supported", lambda *a: True)  # as on a GPU that has the op
    backend = _backend("cpu", torch.bfloat16)
    prefix, new = [0, 9, 0, 4], [5, 3, 7, 1]
    fb = _extend_batch(backend.req_to_token, prefix, new, "cpu")
    q, kv = torch.zeros(16, HQ, D, dtype=torch.bfloat16), torch.zeros(16, HKV, D, dtype=torch.bfloat16)

    backend.init_forward_metadata(fb)
    plan = fb.attn_metadata
    assert plan.cached.req_pool_indices.tolist() == [1, 3] and plan.cached.q_start.tolist() == [5, 15]
    assert plan.cached.prefix_lens.tolist() == [9, 4] and plan.cached.extend_lens.tolist() == [3, 1]
    assert plan.cached.max_extend == 3 and plan.all_rows.max_extend == 7
    per_token = backend.forward(q, kv, kv, 0, fb)[:, 0, 0].tolist()  # the model's entry point: store, then attend
    assert stored == [fb.out_cache_loc.tolist()]
    assert per_token == [1.0] * 5 + [2.0] * 3 + [1.0] * 7 + [2.0]

    fb = _extend_batch(backend.req_to_token, [0, 0, 0, 0], new, "cpu")
    backend.init_forward_metadata(fb)
    assert fb.attn_metadata.cached is None
    assert backend._attend(q, kv, kv, 0, fb)[:, 0, 0].tolist() == [1.0] * 16  # flash alone

    backend.settings = dataclasses.replace(backend.settings, flash_prefill=False)
    backend.init_forward_metadata(fb)
    assert fb.attn_metadata.flash_cu is None
    assert backend._attend(q, kv, kv, 0, fb)[:, 0, 0].tolist() == [2.0] * 16  # the Triton kernel alone

    backend.settings = dataclasses.replace(backend.settings, flash_prefill=True)
    fb = _extend_batch(backend.req_to_token, [0, 9, 0, 4], [1, 9, 1, 1], "cpu")  # 2 fresh tokens, 10 cached
    backend.init_forward_metadata(fb)
    assert fb.attn_metadata.flash_cu is None
    assert backend._attend(q[:12], kv[:12], kv[:12], 0, fb)[:, 0, 0].tolist() == [2.0] * 12


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the flash kernel needs a CUDA device")
def test_flash_prefill_matches_torch_native_on_a_ragged_batch():
    """bf16, a ragged batch mixing prompt-only rows and rows with a cached prefix, q/k/v as views of one
    projection (as the model makes them): flash on, flash off and the torch-native backend agree."""
    from radixflow.runtime.execution.attention.torch_native import TorchNativeBackend

    torch.manual_seed(0)
    on = _backend("cuda", torch.bfloat16)
    assert on.flash_ok, "torch's variable-length flash kernel should run on this GPU"
    off = TritonBackend(kv_pool=on.kv_pool, req_to_token=on.req_to_token, num_q_heads=HQ, num_kv_heads=HKV,
                        head_dim=D, settings=dataclasses.replace(on.settings, flash_prefill=False))
    native = TorchNativeBackend(on.kv_pool, on.req_to_token, HQ, HKV, D)
    pool = on.kv_pool
    pool.k[0].copy_(torch.randn_like(pool.k[0], dtype=torch.float32))
    pool.v[0].copy_(torch.randn_like(pool.v[0], dtype=torch.float32))
    prefix, new = [0, 37, 0, 0, 300], [1, 64, 200, 129, 17]
    fb = _extend_batch(on.req_to_token, prefix, new, "cuda")
    qkv = torch.randn(fb.num_tokens, (HQ + 2 * HKV) * D, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], dim=-1)
    q, k, v = q.view(-1, HQ, D), k.view(-1, HKV, D), v.view(-1, HKV, D)
    outs = []
    for backend in (on, off, native):
        backend.init_forward_metadata(fb)
        if backend is on:
            starts_of_cached = [sum(new[:r]) for r in cached_rows(prefix)]  # rows 1 and 4
            assert fb.attn_metadata.flash_cu is not None and fb.attn_metadata.cached.q_start.tolist() == starts_of_cached
        outs.append(backend.forward(q, k, v, 0, fb).float())
    flash, triton, want = outs
    assert (flash - want).abs().max().item() < 2e-2
    assert (triton - want).abs().max().item() < 2e-2


def test_cudnn_takes_equal_length_prompt_passes_in_a_bounded_set_of_shapes():
    from radixflow.kernels.cudnn_dense import CudnnShapes

    shapes = CudnnShapes(max_shapes=2, min_len=8)
    assert shapes.take([8, 8]) == (2, 8) and shapes.take([16]) == (1, 16)
    assert shapes.take([7, 7]) is None  # rows shorter than min_len
    assert shapes.take([8, 9]) is None  # unequal lengths: the flash kernel
    assert shapes.take([32, 32]) is None  # a third shape: no new graph
    assert shapes.take([8, 8]) == (2, 8)  # shapes already built stay


def test_plan_sends_equal_length_prompt_passes_to_cudnn(monkeypatch):
    """Prompt-only rows of one length take cuDNN where it is supported and on; unequal lengths, a cached prefix,
    cudnn_prefill off or flash_prefill off keep the flash / Triton paths."""
    from radixflow.kernels.cudnn_dense import CudnnShapes

    monkeypatch.setattr(tb, "flash_varlen_supported", lambda *a: True)
    monkeypatch.setattr(tb, "cudnn_dense_supported", lambda *a: True)
    monkeypatch.setattr(tb, "flash_varlen_attention", lambda q, *a: torch.ones_like(q))
    monkeypatch.setattr(tb, "cudnn_dense_attention", lambda q, k, v, rows, length, scale: torch.full_like(q, 4.0))
    backend = _backend("cpu", torch.bfloat16)
    backend.cudnn_shapes = CudnnShapes(min_len=4)
    q, kv = torch.zeros(12, HQ, D, dtype=torch.bfloat16), torch.zeros(12, HKV, D, dtype=torch.bfloat16)

    def first_value(prefix, new):
        fb = _extend_batch(backend.req_to_token, prefix, new, "cpu")
        backend.init_forward_metadata(fb)
        return backend._attend(q[: sum(new)], kv[: sum(new)], kv[: sum(new)], 0, fb)[0, 0, 0].item(), fb.attn_metadata

    value, plan = first_value([0, 0, 0], [4, 4, 4])
    assert value == 4.0 and plan.dense == (3, 4)
    assert first_value([0, 0, 0], [4, 4, 3])[0] == 1.0  # unequal: flash
    assert first_value([0, 0], [2, 2])[0] == 1.0  # below min_len: flash
    assert first_value([0, 3], [6, 6])[1].dense is None  # a cached prefix: flash + Triton
    backend.settings = dataclasses.replace(backend.settings, cudnn_prefill=False)
    assert first_value([0, 0, 0], [4, 4, 4])[0] == 1.0
    backend.settings = dataclasses.replace(backend.settings, cudnn_prefill=True, flash_prefill=False)
    assert first_value([0, 0, 0], [4, 4, 4])[1].flash_cu is None  # no prompt-only path at all


def test_cudnn_off_without_cuda():
    from radixflow.kernels.cudnn_dense import cudnn_dense_supported

    assert not cudnn_dense_supported("cpu", HQ, HKV, D)
    assert not _backend("cpu", torch.bfloat16).cudnn_ok


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch's cuDNN attention needs CUDA")
def test_gpu_cudnn_dense_matches_plain_attention_on_llama_heads():
    """Where the probe says yes: 3 prompts of 1,100 tokens, Llama-3-8B heads, q / k / v as views of one packed qkv
    (the model's layout), against the float32 reference; fresh inputs."""
    from radixflow.kernels.cudnn_dense import cudnn_dense_attention, cudnn_dense_supported
    from radixflow.kernels.flash_varlen import _probe_reference

    if not cudnn_dense_supported("cuda", 32, 8, 128):
        pytest.skip("no cuDNN attention for these heads on this device")
    rows, length = 3, 1100
    qkv = torch.randn(rows * length, 48 * 128, device="cuda", dtype=torch.bfloat16)
    q, k, v = (t.view(rows * length, -1, 128) for t in qkv.split([4096, 1024, 1024], dim=-1))
    got = cudnn_dense_attention(q, k, v, rows, length, 128**-0.5)
    want = _probe_reference(q, k, v, [length] * rows, 128**-0.5)
    assert got.shape == q.shape and torch.isfinite(got).all()
    assert (got.float() - want).abs().max().item() < 2e-2
