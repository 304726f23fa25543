"""FP8 (e4m3) weights: the kernels against their torch references, quantize-at-load against the
unquantized model, and pre-quantized checkpoints in the two config formats (fp8, compressed-tensors).

Without CUDA the Triton kernels run in the interpreter at tiny shapes and the engine takes the CPU
path, which dequantizes; the engine tests compare with transformers running the dequantized weights.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from radixflow import Engine  # noqa: E402
from radixflow.kernels import reference as ref  # noqa: E402
from radixflow.kernels.fp8 import FP8, dequantize, quantize_rows, quantize_rows_torch  # noqa: E402
from radixflow.kernels.gemv import gemv  # noqa: E402
from radixflow.kernels.settings import KernelSettings  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
GEMV_TINY = {"block_n": 16, "block_k": 32, "num_warps": 4, "stages": 3}


# -- kernels -----------------------------------------------------------------------------------
# held in registers (one pass: 4 warps, then 8 warps with a tail that is not a power of two); two passes
@pytest.mark.parametrize("rows,k", [(3, 40), (2, 2500), (2, 9000), (2, 17000)])
def test_quantize_rows_matches_torch(rows, k):
    x = (torch.randn(rows, k, device=DEV) * torch.tensor([0.01, 3.0, 200.0][:rows] + [1.0] * max(0, rows - 3),
                                                          device=DEV)[:, None]).to(torch.bfloat16)
    x[0, 5] = 0.0
    q, s = quantize_rows(x)
    q_ref, s_ref = quantize_rows_torch(x)
    assert q.dtype == FP8 and s.shape == (rows,)
    assert torch.equal(s, s_ref)  # one ulp apart moves the values on a rounding boundary
    assert torch.equal(q.float(), q_ref.float())  # the same rounding (half to even) as torch
    assert (q.float().abs().amax(dim=1) == 448).all()  # each row's largest value maps to e4m3's largest
    err = (dequantize(q, s, torch.float32) - x.float()).abs() / x.float().abs().amax(dim=1, keepdim=True)
    assert err.max().item() <= 2**-4  # e4m3 keeps 3 mantissa bits


def test_scales_multiply_by_the_float32_reciprocal_on_every_device():
    """torch on CUDA divides by a Python number as a product with its reciprocal, torch on the CPU exactly;
    the reference takes the product on both, so the kernel's bits can equal it on either."""
    amax = torch.rand(4096) * 500 + 1e-3
    x = torch.zeros(4096, 3)
    x[:, 1] = -amax
    _, s = quantize_rows_torch(x)
    inv = torch.tensor(1.0 / 448.0, dtype=torch.float32)
    assert torch.equal(s, amax * inv)
    assert not torch.equal(amax * inv, amax / 448.0)  # on the CPU the two rules differ: the check can fail


@pytest.mark.parametrize("residual", [False, True])
def test_rmsnorm_quantized_rows_equal_quantizing_its_output(residual):
    """RMSNorm writing FP8 rows (the input of an FP8 GEMM) gives the bits of quantize_rows over its bf16
    output, and the same residual stream; a width that is not a power of two (masked tail)."""
    from radixflow.kernels.norm_act import rmsnorm

    rows, n = 3, 96
    x = (torch.randn(rows, n, device=DEV) * torch.tensor([0.01, 3.0, 50.0], device=DEV)[:, None]).to(torch.bfloat16)
    w = (torch.rand(n, device=DEV) + 0.5).to(torch.bfloat16)
    r = torch.randn(rows, n, device=DEV) if residual else None
    plain = rmsnorm(x, w, 1e-5, r)
    fused = rmsnorm(x, w, 1e-5, r, quantize=True)
    if residual:
        (plain, res_plain), (fused, res_fused) = plain, fused
        assert torch.equal(res_plain, res_fused)
    q, s = quantize_rows(plain)
    assert fused.dtype == torch.bfloat16 and fused.q.shape == (rows, n) and fused.scale.shape == (rows,)
    assert torch.equal(fused.scale, s)
    assert torch.equal(fused.q.view(torch.uint8), q.view(torch.uint8))


def test_quantized_rows_carry_the_gemms_padding_rows():
    """Above 128 rows an FP8 GEMM's input is allocated to a multiple of 128 rows (torch._scaled_mm's row-wise
    kernel runs those faster); the kernels making it write only the real rows, which keep their bits."""
    from radixflow.kernels.fp8 import gemm_rows
    from radixflow.kernels.norm_act import rmsnorm

    assert [gemm_rows(m) for m in (1, 100, 128, 129, 256, 300, 544, 8192)] == [1, 100, 128, 256, 256, 384, 640, 8192]
    rows, n = 130, 32
    x = (torch.randn(rows, n, device=DEV) * 3).to(torch.bfloat16)
    w = (torch.rand(n, device=DEV) + 0.5).to(torch.bfloat16)
    fused = rmsnorm(x, w, 1e-5, quantize=True)
    q, s = quantize_rows(rmsnorm(x, w, 1e-5))
    assert fused.rows == rows and fused.q.shape == (256, n) and fused.scale.shape == (256,)
    assert torch.equal(fused.q[:rows].view(torch.uint8), q.view(torch.uint8)) and torch.equal(fused.scale[:rows], s)
    q2, s2 = quantize_rows(x, alloc_rows=gemm_rows(rows))
    q1, s1 = quantize_rows(x)
    assert q2.shape == (256, n) and torch.equal(q2[:rows].view(torch.uint8), q1.view(torch.uint8))
    assert torch.equal(s2[:rows], s1)


@pytest.mark.parametrize("interleaved", [False, True])
def test_silu_and_mul_quantized_rows_equal_quantizing_its_output(interleaved):
    """SiLU-and-mul writing FP8 rows: one program a row (the plain kernel splits a row over programs) and
    quantize_rows' bits over its bf16 output."""
    from radixflow.kernels.norm_act import silu_and_mul

    rows, n = 2, 80
    x = (torch.randn(rows, 2 * n, device=DEV) * 2).to(torch.bfloat16)
    plain = silu_and_mul(x, interleaved=interleaved)
    fused = silu_and_mul(x, interleaved=interleaved, quantize=True)
    q, s = quantize_rows(plain)
    assert torch.equal(fused.scale, s)
    assert torch.equal(fused.q.view(torch.uint8), q.view(torch.uint8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch._scaled_mm and the FP8 GEMM path are CUDA's")
def test_fp8_engine_with_quantizing_norms_gives_the_same_bits(monkeypatch):
    """The norms and SiLU-and-mul handing FP8 rows to the GEMMs (KernelSettings.fp8_fused_quantize) change
    no bit of any logprob against quantizing in a kernel of its own: prompts long enough for the GEMM path
    (SmolLM2-135M's shape, random weights; RADIXFLOW_TOKENIZER where the default model is not installed)."""
    import dataclasses
    import os

    from radixflow.kernels import fp8
    from radixflow.kernels.fp8 import Fp8Rows, fp8_gemm
    from radixflow.model_files import resolve_model

    handed = []
    monkeypatch.setattr(fp8, "fp8_gemm", lambda x, *a, **k: handed.append(isinstance(x, Fp8Rows)) or fp8_gemm(x, *a, **k))
    x = torch.randn(5, 64, device=DEV).to(torch.bfloat16)
    w, ws = quantize_rows_torch(torch.randn(32, 64, device=DEV))
    q, s = quantize_rows(x)
    assert torch.equal(fp8_gemm(Fp8Rows(q, s, x.dtype, len(x)), w, None, ws), fp8_gemm(x, w, None, ws))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = os.path.join(root, "benchmarks", "configs", "smollm2-135m.json")
    tok = os.environ.get("RADIXFLOW_TOKENIZER") or resolve_model(None).path
    prompts = [[(13 * i + j) % 49000 + 3 for j in range(40 + 9 * i)] for i in range(6)]
    params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    outs = []
    with Engine(cfg, load_format="dummy", tokenizer_path=tok, max_total_tokens=4096, quantization="fp8",
                dtype="bfloat16") as e:
        for fused in (True, False):
            e.runner.set_kernel_settings(dataclasses.replace(e.runner.settings, fp8_fused_quantize=fused))
            handed.clear()
            res = e.generate(input_ids=prompts, sampling_params=params, return_logprob=True, logprob_start_len=0)
            outs.append([[t[0] for t in r["meta_info"]["input_token_logprobs"][1:] + r["meta_info"]["output_token_logprobs"]]
                         for r in res])
            assert (sum(handed) > 0) == fused and len(handed) > sum(handed)  # o_proj quantizes its own rows
    assert outs[0] == outs[1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU's own division and e4m3 conversion")
def test_quantize_rows_gives_torchs_bits_at_a_gemm_shape():
    """A decode batch of the down projection's input: with an approximate division some bits differed here."""
    x = torch.randn(1024, 14336, device=DEV, dtype=torch.bfloat16)
    q, s = quantize_rows(x)
    q_ref, s_ref = quantize_rows_torch(x)
    assert torch.equal(s, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("variant", [{}, {"words": True}, {"unroll": 2}, {"block_k": 256, "unroll": 2}])
def test_fp8_gemv_matches_dequantized_reference(m, bias, variant):
    """The kernel variants: e4m3 converted by Triton; by bit moves on int32 words; two tiles per loop step.
    72 columns, tiles as gemv_block_k makes them: block_k 32 gives tiles of 16 at both m (the last step
    ragged); block_k 256 at m=1 one step of two 128-column tiles (the first ragged, the second all masked),
    at m=3 tiles of 32 (the one loop step ragged and half masked)."""
    n, k = 40, 72
    x = torch.randn(m, k, device=DEV).to(torch.float16)
    w = torch.randn(n, k, device=DEV)
    w[:, :8] *= 1e-4  # subnormal e4m3 values: exact through the bit moves too
    wq, ws = quantize_rows_torch(w)
    assert (wq.float().abs() < 2**-6).any() and (wq.float() != 0).any()
    b = torch.randn(n, device=DEV).to(torch.float16) if bias else None
    want = ref.gemv_ref(x, dequantize(wq, ws, torch.float32), b)
    config = dict(GEMV_TINY, **variant)
    torch.testing.assert_close(gemv(x, wq, b, config=config, w_scale=ws), want, rtol=2e-3, atol=2e-2)
    if m == 1 and not bias:  # float32 x: the sum is exact enough to see a lost subnormal
        got = gemv(x.float(), wq, config=config, w_scale=ws)
        torch.testing.assert_close(got, ref.gemv_ref(x.float(), dequantize(wq, ws, torch.float32)), rtol=1e-5, atol=1e-5)
        cols = torch.zeros_like(x.float())
        cols[:, :8] = 1.0  # only the subnormal-heavy columns: a flushed subnormal shows
        torch.testing.assert_close(gemv(cols, wq, config=config, w_scale=ws),
                                   ref.gemv_ref(cols, dequantize(wq, ws, torch.float32)), rtol=1e-5, atol=1e-9)


@pytest.mark.skipif(DEV != "cuda", reason="full-size tiles: too slow for the CPU interpreter")
@pytest.mark.parametrize("k", [4096, 5000])  # one tile per row (block_k 4096) or several; a ragged last tile
def test_every_fp8_gemv_config_matches_the_reference(k):
    """The load-time chooser keeps whichever candidate is fastest, so every candidate must be right."""
    from radixflow.kernels.gemv import GEMV_CONFIGS_FP8

    x = torch.randn(2, k, device=DEV).to(torch.bfloat16)
    wq, ws = quantize_rows_torch(torch.randn(96, k, device=DEV))
    want = ref.gemv_ref(x, dequantize(wq, ws, torch.float32))
    for config in GEMV_CONFIGS_FP8:
        for m in (1, 2):
            got = gemv(x[:m], wq, config=config, w_scale=ws)
            torch.testing.assert_close(got.float(), want[:m].float(), rtol=2e-2, atol=5e-2, msg=str(config))


@pytest.mark.skipif(DEV != "cuda", reason="torch._scaled_mm needs a GPU")
@pytest.mark.parametrize("m", [129, 300, 544])
def test_fp8_gemm_over_padded_rows_equals_the_unpadded_product(m):
    """fp8_gemm pads the rows to a multiple of 128 (gemm_rows): its output has m rows, each the unpadded
    product's with the same accumulation (garbage in the padding rows stays there), whether x comes as a tensor
    or as Fp8Rows."""
    from radixflow.kernels.fp8 import empty_rows, fp8_gemm

    x = torch.randn(m, 512, device=DEV).to(torch.bfloat16)
    wq, ws = quantize_rows_torch(torch.randn(256, 512, device=DEV))
    q, s = quantize_rows(x)
    plain = torch._scaled_mm(q, wq.t(), scale_a=s.view(-1, 1), scale_b=ws.view(1, -1), out_dtype=x.dtype,
                             use_fast_accum=KernelSettings().fp8_fast_accum)
    rows = empty_rows(m, 512, x.dtype, DEV)
    assert rows.rows == m and rows.q.shape[0] > m  # padded: m is no multiple of 128
    rows.q.view(torch.uint8).fill_(0x7F)  # NaN in e4m3 in every padding row
    rows.scale.fill_(float("inf"))
    rows.q[:m], rows.scale[:m] = q, s
    for got in (fp8_gemm(x, wq, None, ws), fp8_gemm(rows, wq, None, ws)):
        assert got.shape == (m, 256) and torch.isfinite(got).all()
        torch.testing.assert_close(got, plain, rtol=1e-2, atol=1e-2)


@pytest.mark.skipif(DEV != "cuda", reason="torch._scaled_mm needs a GPU")
@pytest.mark.parametrize("m", [1, 64, 300])
@pytest.mark.parametrize("fast_accum", [False, True])
def test_fp8_gemm_matches_reference(m, fast_accum):
    """Both accumulations (KernelSettings.fp8_fast_accum) give the reference's product, at a long K (4,096, as
    Llama-3-8B's), where fast accumulation's partial sums are longest."""
    from radixflow.kernels.fp8 import fp8_gemm

    x = torch.randn(m, 4096, device=DEV).to(torch.bfloat16)
    wq, ws = quantize_rows_torch(torch.randn(256, 4096, device=DEV) * 0.02)
    b = torch.randn(256, device=DEV).to(torch.bfloat16)
    want = ref.fp8_linear_ref(x, wq, ws, b)
    got = fp8_gemm(x, wq, b, ws, KernelSettings(fp8_fast_accum=fast_accum))
    torch.testing.assert_close(got, want, rtol=2e-2, atol=5e-2)


@pytest.mark.skipif(DEV != "cuda", reason="torch._scaled_mm needs a GPU")
def test_fp8_gemm_accumulates_as_its_settings_say():
    """fp8_gemm's product is torch._scaled_mm's with the accumulation KernelSettings.fp8_fast_accum names, bit for
    bit, and the two accumulations differ at K = 4,096: a flag the GEMM ignored would fail one of the checks."""
    from radixflow.kernels.fp8 import fp8_gemm

    x = torch.randn(64, 4096, device=DEV).to(torch.bfloat16)
    wq, ws = quantize_rows_torch(torch.randn(256, 4096, device=DEV) * 0.02)
    q, s = quantize_rows(x)
    outs = {}
    for fast in (True, False):
        outs[fast] = fp8_gemm(x, wq, None, ws, KernelSettings(fp8_fast_accum=fast))
        plain = torch._scaled_mm(q, wq.t(), scale_a=s.view(-1, 1), scale_b=ws.view(1, -1), out_dtype=x.dtype,
                                 use_fast_accum=fast)
        assert torch.equal(outs[fast], plain), fast
    assert not torch.equal(outs[True], outs[False])


# -- checkpoints and the engine ---------------------------------------------------------------
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
PROMPTS = ["Hello there, how are", "The capital of France is Paris and the capital of Spain"]
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _tiny_llama(vocab: int):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**TINY, vocab_size=vocab), dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    return model.eval()


def _save(model, path, tokenizer_dir: str, tensors: dict | None = None, quantization_config: dict | None = None) -> str:
    from safetensors.torch import save_file

    model.save_pretrained(path)
    if tensors is not None:
        for f in os.listdir(path):
            if f.endswith(".safetensors"):
                os.remove(os.path.join(path, f))
        save_file(tensors, os.path.join(path, "model.safetensors"))
    if quantization_config is not None:
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
        config["quantization_config"] = quantization_config
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(config, f)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if os.path.exists(os.path.join(tokenizer_dir, f)):
            shutil.copy(os.path.join(tokenizer_dir, f), os.path.join(path, f))
    return str(path)


def _quantized_tensors(model, per_tensor: bool) -> tuple[dict, dict]:
    """(checkpoint tensors with FP8 linears, the same state dict with those weights dequantized)."""
    tensors, dequantized = {}, {}
    for name, w in model.state_dict().items():
        if name.endswith(".weight") and name.split(".")[-2] in LINEARS:
            if per_tensor:  # one scale for the whole matrix, as quant_method "fp8" checkpoints store it
                scale = (w.abs().max() / 448.0).reshape(())
                q = (w / scale).clamp(-448, 448).to(FP8)
                scale_full = scale.expand(w.shape[0])
            else:  # compressed-tensors "channel": [N, 1]
                q, scale_full = quantize_rows_torch(w)
                scale = scale_full[:, None]
            tensors[name] = q
            tensors[name.replace(".weight", ".weight_scale")] = scale.clone()
            tensors[name.replace(".weight", ".input_scale")] = torch.tensor(0.01)  # static: ignored (dynamic per token)
            dequantized[name] = dequantize(q, scale_full, torch.float32)
        else:
            tensors[name] = w.contiguous()
            dequantized[name] = w
    return tensors, dequantized


def _engine_logprobs(path: str, **kw) -> list:
    with Engine(path, max_total_tokens=2048, **kw) as e:
        outs = e.generate(PROMPTS, {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
                          return_logprob=True, logprob_start_len=0)
    return outs


def _hf_logprobs(model, tokenizer, outs) -> list[torch.Tensor]:
    """Teacher-forced logprobs of each prompt + the engine's output under `model`, at the same positions."""
    got, want = [], []
    for prompt, out in zip(PROMPTS, outs):
        ids = tokenizer.encode(prompt) + out["output_ids"]
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        n = len(tokenizer.encode(prompt))
        got += [t[0] for t in out["meta_info"]["input_token_logprobs"][1:]] + [t[0] for t in out["meta_info"]["output_token_logprobs"]]
        want += [lp[i - 1, ids[i]].item() for i in range(1, len(ids))]
        assert len(got) == len(want), (n, len(ids))
    return torch.tensor(got), torch.tensor(want)


def test_quantize_at_load_matches_dequantized_model_and_stays_near_the_original(tmp_path, model_dir, tokenizer):
    model = _tiny_llama(len(tokenizer))
    path = _save(model, tmp_path / "bf16", model_dir)
    fp8_outs = _engine_logprobs(path, quantization="fp8")
    _, dequantized = _quantized_tensors(model, per_tensor=False)  # the per-channel rows --quantization fp8 makes
    deq_model = _tiny_llama(len(tokenizer))
    deq_model.load_state_dict(dequantized)
    got, want = _hf_logprobs(deq_model, tokenizer, fp8_outs)
    assert (got - want).abs().max().item() < 1e-3  # exactly the dequantized model (CPU path, float32 activations)
    got, original = _hf_logprobs(model, tokenizer, fp8_outs)
    drift = (got - original).abs()
    # quantized: not identical, yet near (this random model has large weights, so every error is amplified)
    assert 0 < drift.max().item() and drift.mean().item() < 0.5


@pytest.mark.parametrize("fmt", ["fp8", "compressed-tensors"])
def test_prequantized_checkpoint_loads(tmp_path, model_dir, tokenizer, fmt):
    model = _tiny_llama(len(tokenizer))
    per_tensor = fmt == "fp8"
    tensors, dequantized = _quantized_tensors(model, per_tensor)
    if fmt == "fp8":
        qc = {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]}
    else:
        scheme = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False}
        qc = {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
              "config_groups": {"group_0": {"targets": ["Linear"], "weights": dict(scheme, strategy="channel"),
                                            "input_activations": dict(scheme, strategy="tensor")}}}
    path = _save(model, tmp_path / fmt, model_dir, tensors, qc)
    outs = _engine_logprobs(path)  # detected from config.json, no flag needed
    deq_model = _tiny_llama(len(tokenizer))
    deq_model.load_state_dict(dequantized)
    got, want = _hf_logprobs(deq_model, tokenizer, outs)
    assert (got - want).abs().max().item() < 1e-3


@pytest.mark.parametrize("qc,msg", [
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "block-wise"),
    ({"quant_method": "gptq", "bits": 4}, "not supported"),
])
def test_unsupported_quantization_configs_say_what_to_do(tmp_path, model_dir, tokenizer, qc, msg):
    from radixflow.runtime.execution.layers.fp8_linear import QuantizationError

    path = _save(_tiny_llama(len(tokenizer)), tmp_path / "bad", model_dir, quantization_config=qc)
    with pytest.raises(QuantizationError, match=msg):
        Engine(path, max_total_tokens=1024)


def test_fp8_tensors_without_a_quantization_config_are_refused(tmp_path, model_dir, tokenizer):
    from radixflow.runtime.execution.layers.fp8_linear import QuantizationError

    model = _tiny_llama(len(tokenizer))
    tensors, _ = _quantized_tensors(model, per_tensor=False)
    tensors = {k: v for k, v in tensors.items() if not k.endswith("_scale")}
    path = _save(model, tmp_path / "noconfig", model_dir, tensors)
    with pytest.raises(QuantizationError, match="quantization_config"):
        Engine(path, max_total_tokens=1024)


# -- FP8 KV cache (its attention kernels: tests/test_fp8_attention.py) ------------------------------
def test_fp8_kv_cache_engine_stays_near_the_full_precision_cache(tmp_path, model_dir, tokenizer):
    """--kv-cache-dtype fp8_e4m3 (torch-native on CPU), with the checkpoint's calibrated per-layer scales:
    teacher-forced logprobs near those of the float32 cache, not equal to them."""
    from safetensors.torch import load_file, save_file

    model = _tiny_llama(len(tokenizer))
    path = _save(model, tmp_path / "kv", model_dir)
    tensors = load_file(os.path.join(path, "model.safetensors"))
    for i in range(TINY["num_hidden_layers"]):  # K/V of this model reach ~+-8: scales keep them in e4m3's fine range
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(0.05)
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(0.02)
    save_file(tensors, os.path.join(path, "model.safetensors"))
    full = _engine_logprobs(path)
    got = []
    with Engine(path, max_total_tokens=2048, kv_cache_dtype="fp8_e4m3") as e:
        pool = e.runner.kv_pool
        assert pool.k[0].dtype == FP8 and pool.k_scale[1].tolist() == pytest.approx([0.05, 0.05])
        assert pool.v_scale[0].tolist() == pytest.approx([0.02, 0.02])
        for prompt, o in zip(PROMPTS, full):  # the float32 cache's tokens, teacher-forced through the FP8 cache
            ids = tokenizer.encode(prompt) + o["output_ids"]
            r = e.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0},
                           return_logprob=True, logprob_start_len=0)
            got += [t[0] for t in r["meta_info"]["input_token_logprobs"][1:]]
    want = [t[0] for o in full for t in o["meta_info"]["input_token_logprobs"][1:] + o["meta_info"]["output_token_logprobs"]]
    diff = torch.tensor(got) - torch.tensor(want)
    assert 0 < diff.abs().max().item() and diff.abs().mean().item() < 0.1


def test_docs_fp8_example_runs(tmp_path, model_dir, tokenizer, monkeypatch, capsys):
    """docs/gpu.md's FP8 example, run as written except that the Engine it builds loads a tiny checkpoint
    instead of the default model (whose FP8 conversion on CPU would cost this test minutes): the flags
    and calls are the README's, and the engine has FP8 linears and an FP8 KV pool."""
    import re

    import radixflow

    page = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "gpu.md")).read()
    code = re.search(r"<!-- docs-test: skip: tests/test_fp8.py[^>]*-->\n```python\n(.*?)```", page, re.S).group(1)
    path = _save(_tiny_llama(len(tokenizer)), tmp_path / "tiny", model_dir)
    built = []

    class TinyEngine(radixflow.Engine):
        def __init__(self, model_path=None, **kwargs):
            assert model_path is None  # the docs' example uses the default model
            super().__init__(path, max_total_tokens=1024, **kwargs)
            built.append((self.runner.kv_pool.k[0].dtype, self.runner.model.layers[0].mlp.down_proj.weight.dtype))

    monkeypatch.setattr(radixflow, "Engine", TinyEngine)
    exec(code, {})
    assert built == [(FP8, FP8)]
    assert capsys.readouterr().out.strip()


def test_fp8_flags_refuse_what_they_cannot_serve():
    from radixflow.errors import RadixflowError
    from radixflow.runtime.server_args import ServerArgs

    with pytest.raises(RadixflowError, match="only quantization is fp8"):
        ServerArgs(quantization="int4")
    with pytest.raises(RadixflowError, match="triton or torch_native"):
        ServerArgs(kv_cache_dtype="fp8_e4m3", attention_backend="flashinfer")
    with pytest.raises(RadixflowError, match="drop --quantization"):
        ServerArgs(quantization="fp8", enable_deterministic_inference=True)
