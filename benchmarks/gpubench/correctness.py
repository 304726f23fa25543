"""Sections correctness, tiny_ckpt: Triton against torch-native logprobs, and HF greedy on a saved checkpoint."""

from __future__ import annotations

import dataclasses
import os
import time
import traceback

import torch

from gpubench.common import DEV, OPTS, SZ, TOKENIZER_FILES, TOKENIZER_VOCAB, flash_prefill_on, free, log, make_engine


def _compare(cand, ref, tol: float = 2e-2) -> dict:
    """logprob_check.compare plus the spread of |dlogprob| over all scored positions: the
    median, the 99th percentile and the fraction within tol (the max alone hides the shape)."""
    from logprob_check import compare

    d = sorted(abs(x - y) for a, b in ((cand.input_lps, ref.input_lps), (cand.output_lps, ref.output_lps))
               for xs, ys in zip(a, b) for x, y in zip(xs, ys))
    res = compare(cand, ref)
    res.update(p50_abs=d[len(d) // 2], p99_abs=d[int(0.99 * (len(d) - 1))], frac_within_tol=sum(x <= tol for x in d) / len(d))
    return res


def _check_backends(config: str, dtype: str, tol: float, shared: int, long: int, chunk: int, **triton_kw) -> dict:
    from logprob_check import make_prompts, run_candidate, run_reference

    kw = dict(dtype=dtype, max_total_tokens=32768, chunked_prefill_size=chunk, cuda_graph_max_bs=8, max_running_requests=16)
    warm, batch, starts = make_prompts(TOKENIZER_VOCAB, shared, long, seed=1)
    eng = make_engine(config, attention_backend="torch_native" if OPTS.smoke else "triton", **kw, **triton_kw)
    assert OPTS.smoke or eng.runner.graph_runner is not None
    flash = flash_prefill_on(eng)
    cand = run_candidate(eng, warm, batch, starts, new_tokens=16)
    hit = eng.scheduler.stats.cached_tokens
    free(eng)
    ref_eng = make_engine(config, attention_backend="torch_native", **kw)
    ref = run_reference(ref_eng, warm, cand, starts)
    free(ref_eng)
    res = _compare(cand, ref, tol)
    res.update(cached_tokens=hit, flash_prefill=flash, tol=tol, ok=max(res["prefill_max_abs"], res["decode_max_abs"]) <= tol)
    return res


def _check_flash(config: str, shared: int, long: int, chunk: int) -> dict:
    """bf16 Triton engine against bf16 torch-native, with prompt-only prefill rows through torch's flash
    kernel (the default where it runs) and with the Triton extend kernel for every row."""
    return {"flash_on": _check_backends(config, "bfloat16", 2e-2, shared, long, chunk),
            "flash_off": _check_backends(config, "bfloat16", 2e-2, shared, long, chunk, disable_flash_prefill=True)}


def _solo_reference(eng, warm: list, cand, starts: list):
    """run_reference with each request alone: same tokens and cache state (flushed, warm-up
    prefix cached), only the batching and chunk boundaries differ."""
    from logprob_check import RunLogprobs, run_reference

    runs = [run_reference(eng, warm, RunLogprobs([p], [[]], [o], [[]]), [s])
            for p, o, s in zip(cand.prompts, cand.output_ids, starts)]
    return RunLogprobs(cand.prompts, [r.input_lps[0] for r in runs], cand.output_ids, [r.output_lps[0] for r in runs])


def _check_bf16(config: str, shared: int, long: int, chunk: int, deterministic: bool = False, **triton_kw) -> dict:
    """bf16 Triton and bf16 torch-native, each against a float32 torch-native run of the
    same (bf16-rounded) weights: how far each bf16 path is from exact arithmetic. Two
    torch-native-only baselines show what bf16 itself allows: the whole check with native as
    the candidate too, and teacher-forced scoring of each request alone vs the batch; and one that
    shows what float32 attention itself allows: the bf16 torch-native reference with its attention
    computed in float64 (exact, then rounded once) against the same with float32 attention.
    `deterministic`: both bf16 engines with --enable-deterministic-inference (the float32 one without);
    `triton_kw`: more server arguments for the Triton engine alone (kernel settings)."""
    from logprob_check import make_prompts, run_candidate, run_reference

    kw = dict(max_total_tokens=32768, chunked_prefill_size=chunk, cuda_graph_max_bs=8, max_running_requests=16)
    det = dict(kw, enable_deterministic_inference=deterministic)
    warm, batch, starts = make_prompts(TOKENIZER_VOCAB, shared, long, seed=1)
    tri = make_engine(config, attention_backend="torch_native" if OPTS.smoke else "triton", dtype="bfloat16", **det,
                      **triton_kw)
    cand = run_candidate(tri, warm, batch, starts, new_tokens=16)
    if deterministic:  # the Triton engine against itself: teacher-forced alone vs the generating batch
        res_det = {"triton_solo_vs_batched_bf16": _compare(_solo_reference(tri, warm, cand, starts),
                                                           run_reference(tri, warm, cand, starts))}
    nat16 = make_engine(config, attention_backend="torch_native", dtype="bfloat16", **det)
    ref16 = run_reference(nat16, warm, cand, starts)
    nat_cand = run_candidate(nat16, warm, batch, starts, new_tokens=16)
    res = {"native_vs_native_bf16": _compare(nat_cand, run_reference(nat16, warm, nat_cand, starts)),
           "native_solo_vs_batched_bf16": _compare(_solo_reference(nat16, warm, cand, starts), ref16)}
    exact = dataclasses.replace(nat16.runner.settings, native_attention_dtype="float64")
    nat16.runner.set_kernel_settings(exact)  # exact attention: where float32 attention itself leads
    ref16_exact = run_reference(nat16, warm, cand, starts)
    res.update(native_exact_attention_vs_native_bf16=_compare(ref16_exact, ref16),
               triton_vs_native_exact_attention_bf16=_compare(cand, ref16_exact))
    free(nat16)
    nat32 = make_engine(config, attention_backend="torch_native", dtype="float32", **kw)
    with torch.no_grad():
        for dst, src in zip(nat32.runner.model.parameters(), tri.runner.model.parameters()):
            dst.copy_(src.float())
        for dst, src in zip(nat32.runner.model.layers, tri.runner.model.layers):
            dst.mlp.interleaved = src.mlp.interleaved  # a folded model's gate_up rows (layers/norm_fold.py)
    free(tri)
    ref32 = run_reference(nat32, warm, cand, starts)
    free(nat32)
    res.update(triton_vs_native_bf16=_compare(cand, ref16), triton_bf16_vs_fp32=_compare(cand, ref32),
               native_bf16_vs_fp32=_compare(ref16, ref32))
    res["ok"] = max(res["triton_vs_native_bf16"]["prefill_max_abs"], res["triton_vs_native_bf16"]["decode_max_abs"]) <= 2e-2
    if deterministic:
        res.update(res_det)
    return res


def _check_bf16_p_parts(config: str, parts: int, shared: int, long: int, chunk: int) -> dict:
    """_check_bf16 with the Triton kernels multiplying p in `parts` bf16 parts (kernels/attention_common.py)."""
    return _check_bf16(config, shared, long, chunk, attention_p_parts=parts)


def _check_bf16_unfused(config: str, shared: int, long: int, chunk: int) -> dict:
    """_check_bf16 with the Triton engine's rotary and SiLU-and-mul in torch, so the two backends
    differ only in attention."""
    return _check_bf16(config, shared, long, chunk, disable_fused_kernels=True)


def sec_correctness() -> dict:
    out = {}
    sizes = (SZ["corr_shared"], SZ["corr_long"], SZ["corr_chunk"])
    checks = {"float32": lambda c: _check_backends(c, "float32", 1e-3, *sizes),
              "bfloat16": lambda c: _check_bf16(c, *sizes),
              "bfloat16-det": lambda c: _check_bf16(c, *sizes, deterministic=True),
              "bfloat16-unfused": lambda c: _check_bf16_unfused(c, *sizes),
              "bfloat16-flash": lambda c: _check_flash(c, *sizes),
              **{f"bfloat16-p{n}": (lambda c, n=n: _check_bf16_p_parts(c, n, *sizes)) for n in (1, 2)}}
    for config in OPTS.corr_configs.split(","):
        for dtype in OPTS.corr_dtypes.split(","):
            key = f"{config}/{dtype}"
            try:
                out[key] = checks[dtype](config)
            except Exception as e:  # keep the other combinations
                out[key] = {"error": repr(e), "trace": traceback.format_exc()[-1500:]}
            log(f"correctness {key}: {out[key]}")
    return out


def _build_tiny_checkpoint(path: str) -> None:
    import shutil

    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=TOKENIZER_VOCAB, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=True, initializer_range=0.05, bos_token_id=1, eos_token_id=2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path)
    for f in TOKENIZER_FILES:
        if os.path.isfile(os.path.join(OPTS.tokenizer, f)):
            shutil.copy(os.path.join(OPTS.tokenizer, f), path)


def sec_tiny_ckpt() -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = "/tmp/radixflow-tiny-llama"
    _build_tiny_checkpoint(path)
    tok = AutoTokenizer.from_pretrained(path)
    texts = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "List three colors:",
             "Q: What is 12 plus 30?\nA:", "The quick brown fox", "import numpy as np\n", "Dear Sir or Madam,"]
    prompts = [tok(t).input_ids for t in texts]
    n = SZ["tiny_new"]
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(DEV).eval()
    t = time.perf_counter()
    with torch.no_grad():
        want = [hf.generate(torch.tensor([p], device=DEV), max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, len(p):].tolist()
                for p in prompts]
    out = {"hf_generate_s": time.perf_counter() - t}
    free(hf)
    for backend in ("torch_native",) if OPTS.smoke else ("torch_native", "triton"):
        eng = make_engine(path, dtype="float32", device=DEV, attention_backend=backend)
        t = time.perf_counter()
        got = [r["output_ids"] for r in eng.generate(input_ids=prompts, sampling_params={"max_new_tokens": n, "min_new_tokens": n, "temperature": 0.0})]
        out[backend] = {"equal": sum(g == w for g, w in zip(got, want)), "of": len(prompts), "s": time.perf_counter() - t,
                        "first_diff": [next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), None) for g, w in zip(got, want)]}
        free(eng)
    return out
