"""One script for the GPU machine: correctness of the Triton path, then benchmarks.

    python3 benchmarks/gpu_bench.py --out $OUT --sections env,ceilings,pytest,correctness,decode_bs1
    python benchmarks/gpu_bench.py --smoke --sections offline,idle   # CPU: tiny model, plumbing only

The tokenizer (default: .gpu_assets/tokenizer, a git-ignored copy of the default model's
tokenizer files, carried to the GPU machine) only has to cover the random prompt ids.

Sections (each isolated: a failure is logged and the next one runs):
  env          versions, GPU, whether server/grammar packages are missing
  ceilings     HBM copy bandwidth and bf16 matmul rate, measured here
  pytest       tests/test_kernels.py on the GPU (including the `gpu` tests)
  correctness  Triton vs torch-native teacher-forced logprobs (SmolLM2 and Llama-3-8B shapes,
               float32 and bf16, dummy weights), mixed fresh / cache-hit / chunked batch; in bf16
               also torch-native vs itself (as candidate; each request alone vs batched);
               --corr-dtypes bfloat16-det (deterministic inference), bfloat16-p1|p2|p3 (p in N parts),
               bfloat16-unfused (Triton's rotary and SiLU-and-mul in torch)
  tiny_ckpt    a random 4-layer Llama saved by transformers: radixflow greedy == HF greedy
  decode_bs1   batch-1 decode, Llama-3-8B bf16, 128 in / 256 out, CUDA graphs on and off, and graphs
               recaptured without PDL, with rotary outside decode attention, with a bf16 residual
               stream and with attention's p in each other number of parts; profiles
               of a bare graph replay and of ~30 engine steps (GPU work outside the graph, idle)
  sampled_bs1  batch-1 decode with top-p sampling (Triton kernel, torch's path) against greedy
  gemv_configs batch-1 decode with the chooser's GEMV config per shape against one config for all
  qwen3        Qwen3-8B shape: runs, batch-1 decode speed
  hf           transformers generate: batch 1 eager + batch 64 (the offline workload's first 64)
  hf_compile   transformers batch 1 with static cache + torch.compile(mode="reduce-overhead"), 128 out:
               generate()'s own compiled decode step, else a compiled decode loop (--hf-compile)
  offline      1000 requests, in U[32,1024], out U[32,512], ignore_eos: a cold pass, then one warm pass on
               each workload seed of --offline-seeds (three by default)
  offline_1k   1000 requests of 1000 prompt tokens and 1000 output tokens
  bs1          batch-1 decode against the bytes a step must read (weights used, KV), nothing else
  offline_pdl_ab / offline_residual_ab / offline_p_parts_ab   offline under each of two or three settings
  shared       256 x (4096 shared + 128) -> 128 out, radix on vs off
  idle         GPU idle fraction between decode steps at batch 64
  prefill      8 x 2048-token prompts vs the measured matmul rate, FLOPs counted as computed (the output
               head for last tokens only); --prefill-p-parts-ab also times p in 1, 2, 3 parts
  deterministic  --enable-deterministic-inference vs default: batch 1 and 64 decode, prefill 8 x 2,048, alone vs batched
A section named twice runs twice (results under name, name#1, ...). A bench-engine section
runs in a variant's engine when named section@variant: bf16 (default), fp8 (FP8 weights), kv8
(FP8 KV cache), fp8kv8 (both), e.g. --sections ceilings,bs1,bs1@fp8,offline,offline@fp8. Results go to
OUT/results.json and OUT/bench.log; a table is printed last.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
CONFIGS = os.path.join(ROOT, "benchmarks", "configs")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
TOKENIZER_VOCAB = 49152  # SmolLM2's; random prompt ids stay below it

RESULTS: dict = {}
OPTS = argparse.Namespace()
# workload sizes; --smoke (CPU, tiny model) shrinks them to check the script's plumbing
SIZES = dict(offline=1000, in_max=1024, out_max=512, shared_n=256, shared_len=4096, shared_out=128, idle_bs=64,
             idle_out=256, prefill_n=8, prefill_len=2048, bs1_out=256, corr_shared=300, corr_long=1500, corr_chunk=512,
             hf_bs1_out=64, tiny_new=32, hf_compile_out=128, k1_n=1000, k1_len=1000)
SMOKE = dict(offline=12, in_max=64, out_max=16, shared_n=6, shared_len=96, shared_out=8, idle_bs=4, idle_out=12,
             prefill_n=2, prefill_len=64, bs1_out=16, corr_shared=24, corr_long=80, corr_chunk=32, hf_bs1_out=8, tiny_new=8,
             hf_compile_out=12, k1_n=6, k1_len=24)
TINY_CONFIG = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=TOKENIZER_VOCAB, max_position_embeddings=4096,
    rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
)


# -- plumbing ----------------------------------------------------------------------------------
SZ = dict(SIZES)
DEV = "cuda" if torch.cuda.is_available() else "cpu"


class Event:
    """A CUDA timing event; a host clock on CPU (smoke runs)."""

    def __init__(self):
        self.ev = torch.cuda.Event(enable_timing=True) if DEV == "cuda" else None
        self.t = 0.0

    def record(self) -> None:
        if self.ev is not None:
            self.ev.record()
        self.t = time.perf_counter()

    def elapsed_time(self, other: "Event") -> float:
        return self.ev.elapsed_time(other.ev) if self.ev is not None else 1e3 * (other.t - self.t)


def log(msg: str) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    with open(os.path.join(OPTS.out, "bench.log"), "a") as f:
        f.write(line + "\n")


def save() -> None:
    with open(os.path.join(OPTS.out, "results.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)


def config_path(config: str) -> str:
    if OPTS.smoke:
        path = "/tmp/radixflow-smoke-config.json"
        with open(path, "w") as f:
            json.dump(TINY_CONFIG, f)
        return path
    return os.path.join(CONFIGS, f"{config}.json")


def make_engine(config: str, **kw):
    import radixflow

    path = config if os.path.isdir(config) else config_path(config)
    if OPTS.smoke:
        kw.update(device="cpu", dtype="float32")
        kw.pop("mem_fraction_static", None)
        kw.setdefault("max_total_tokens", 8192)
    if not os.path.isdir(path):
        kw.setdefault("load_format", "dummy")
        kw.setdefault("tokenizer_path", OPTS.tokenizer)
    t = time.perf_counter()
    engine = radixflow.Engine(path, **kw)
    log(f"engine {config} {kw} ready in {time.perf_counter() - t:.1f}s")
    return engine


def free(*objs) -> None:
    for o in objs:
        if hasattr(o, "shutdown"):
            o.shutdown()
    del objs
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def rand_ids(rng: random.Random, n: int) -> list:
    return [rng.randrange(3, TOKENIZER_VOCAB) for _ in range(n)]


def greedy(n: int, **extra) -> dict:
    return {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True, **extra}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def cuda_time(fn, reps: int) -> float:
    """Median seconds of fn() by CUDA events."""
    if not torch.cuda.is_available():
        return statistics.median(wall(fn) for _ in range(reps))
    from cuda_timing import cuda_median_s

    return cuda_median_s(fn, reps)


def wall(fn) -> float:
    sync()
    t = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t


def weight_bytes(model) -> tuple[int, int]:
    """(all parameter bytes, bytes a decode step reads: all but an untied embedding, of which a step
    reads one row per token). Quantized weights count at their stored size, their scales included."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb = model.embed_tokens.weight
    tied = model.lm_head is None
    return total, total - (0 if tied else emb.numel() * emb.element_size())


def kv_bytes_per_token(runner) -> int:
    """KV-cache bytes one cached token costs a decode step to read (every layer's K and V)."""
    pool = runner.kv_pool
    return sum(t[0].numel() * t.element_size() for t in pool.k + pool.v)


def decode_step_read_bytes(runner, mean_context: float) -> float:
    """Bytes one batch-1 decode step must read: the weights it uses and the KV of `mean_context` tokens."""
    return weight_bytes(runner.model)[1] + mean_context * kv_bytes_per_token(runner)


def prefill_flops(model, n: int, length: int) -> float:
    """FLOPs of n fresh prompts of `length` tokens as computed: every token through every layer's
    linears and causal attention, the output head for each prompt's last token only."""
    s = model.shape
    layer_params = sum(p.numel() for name, p in model.layers.named_parameters() if p.dim() == 2)
    head = s.vocab_size * s.hidden
    attention = 4 * s.num_layers * s.num_heads * s.head_dim * length * (length + 1) / 2  # QK^T and PV, per prompt
    return n * (2 * length * layer_params + 2 * head + attention)


# -- sections ----------------------------------------------------------------------------------
def sec_env() -> dict:
    import importlib.util

    import triton
    import transformers

    missing = [m for m in ("zmq", "fastapi", "uvicorn", "outlines_core", "flashinfer") if importlib.util.find_spec(m) is None]
    query = ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit", "--format=csv"]
    smi = subprocess.run(query, capture_output=True, text=True).stdout.strip() if DEV == "cuda" else ""
    return {"torch": torch.__version__, "triton": triton.__version__, "transformers": transformers.__version__,
            "gpu": torch.cuda.get_device_name() if DEV == "cuda" else "cpu", "missing_packages": missing, "nvidia_smi": smi}


def _copy_bandwidth() -> float:
    """Bytes read + written per second by a 2 GiB device-to-device copy (median of 30), after
    ~0.1 s of copies: one warm-up copy had read 4.15 and 4.26 TB/s minutes apart on one machine."""
    src = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    for _ in range(100):
        dst.copy_(src)
    return 2 * src.numel() * src.element_size() / cuda_time(lambda: dst.copy_(src), 30)


def _matmul_rate() -> float:
    """bf16 FLOP/s of an 8192^3 product on random data."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    return 2 * 8192**3 / cuda_time(lambda: a @ b, 10)


def _read_bandwidth() -> dict:
    """{probe: TB/s} of kernels that only read (benchmarks/read_bandwidth.py)."""
    from read_bandwidth import read_bandwidths

    return {name: bps / 1e12 for name, bps in read_bandwidths().items()}


def _fp8_matmul_rate() -> float:
    """e4m3 FLOP/s of an 8192^3 torch._scaled_mm with row-wise scales and bf16 output (the FP8 linear's GEMM)."""
    a = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
    sa, sb = torch.ones(8192, 1, device="cuda"), torch.ones(1, 8192, device="cuda")
    mm = lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)  # noqa: E731
    for _ in range(3):
        mm()
    return 2 * 8192**3 / cuda_time(mm, 10)


def sec_ceilings() -> dict:
    copy, read = _copy_bandwidth(), _read_bandwidth()
    RESULTS["_bw"], RESULTS["_mm"] = max(copy, max(read.values()) * 1e12), _matmul_rate()
    out = {"copy_bw_TBps": copy / 1e12, "read_bw_TBps": read, "hbm_bw_TBps": RESULTS["_bw"] / 1e12,
           "bf16_matmul_TFLOPs": RESULTS["_mm"] / 1e12}
    try:
        RESULTS["_mm8"] = _fp8_matmul_rate()
        out["fp8_rowwise_matmul_TFLOPs"] = RESULTS["_mm8"] / 1e12
    except Exception as e:  # noqa: BLE001 - recorded: an older torch without row-wise scales
        out["fp8_matmul_error"] = repr(e)[:300]
    free()
    return out


def sec_pytest() -> dict:
    env = dict(os.environ, RADIXFLOW_TOKENIZER=OPTS.tokenizer, PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_kernels.py"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    with open(os.path.join(OPTS.out, "pytest_gpu.log"), "w") as f:
        f.write(out.stdout + out.stderr)
    return {"rc": out.returncode, "summary": out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-500:]}


def _compare(cand, ref, tol: float = 2e-2) -> dict:
    """logprob_check.compare plus the spread of |dlogprob| over all scored positions: the
    median, the 99th percentile and the fraction within tol (the max alone hides the shape)."""
    from logprob_check import compare

    d = sorted(abs(x - y) for a, b in ((cand.input_lps, ref.input_lps), (cand.output_lps, ref.output_lps))
               for xs, ys in zip(a, b) for x, y in zip(xs, ys))
    res = compare(cand, ref)
    res.update(p50_abs=d[len(d) // 2], p99_abs=d[int(0.99 * (len(d) - 1))], frac_within_tol=sum(x <= tol for x in d) / len(d))
    return res


def _check_backends(config: str, dtype: str, tol: float, shared: int, long: int, chunk: int) -> dict:
    from logprob_check import make_prompts, run_candidate, run_reference

    kw = dict(dtype=dtype, max_total_tokens=32768, chunked_prefill_size=chunk, cuda_graph_max_bs=8, max_running_requests=16)
    warm, batch, starts = make_prompts(TOKENIZER_VOCAB, shared, long, seed=1)
    eng = make_engine(config, attention_backend="torch_native" if OPTS.smoke else "triton", **kw)
    assert OPTS.smoke or eng.runner.graph_runner is not None
    cand = run_candidate(eng, warm, batch, starts, new_tokens=16)
    hit = eng.scheduler.stats.cached_tokens
    free(eng)
    ref_eng = make_engine(config, attention_backend="torch_native", **kw)
    ref = run_reference(ref_eng, warm, cand, starts)
    free(ref_eng)
    res = _compare(cand, ref, tol)
    res.update(cached_tokens=hit, tol=tol, ok=max(res["prefill_max_abs"], res["decode_max_abs"]) <= tol)
    return res


def _solo_reference(eng, warm: list, cand, starts: list):
    """run_reference with each request alone: same tokens and cache state (flushed, warm-up
    prefix cached), only the batching and chunk boundaries differ."""
    from logprob_check import RunLogprobs, run_reference

    runs = [run_reference(eng, warm, RunLogprobs([p], [[]], [o], [[]]), [s])
            for p, o, s in zip(cand.prompts, cand.output_ids, starts)]
    return RunLogprobs(cand.prompts, [r.input_lps[0] for r in runs], cand.output_ids, [r.output_lps[0] for r in runs])


def _check_bf16(config: str, shared: int, long: int, chunk: int, deterministic: bool = False) -> dict:
    """bf16 Triton and bf16 torch-native, each against a float32 torch-native run of the
    same (bf16-rounded) weights: how far each bf16 path is from exact arithmetic. Two
    torch-native-only baselines show what bf16 itself allows: the whole check with native as
    the candidate too, and teacher-forced scoring of each request alone vs the batch; and one that
    shows what float32 attention itself allows: the bf16 torch-native reference with its attention
    computed in float64 (exact, then rounded once) against the same with float32 attention.
    `deterministic`: both bf16 engines with --enable-deterministic-inference (the float32 one without)."""
    from logprob_check import make_prompts, run_candidate, run_reference

    kw = dict(max_total_tokens=32768, chunked_prefill_size=chunk, cuda_graph_max_bs=8, max_running_requests=16)
    det = dict(kw, enable_deterministic_inference=deterministic)
    warm, batch, starts = make_prompts(TOKENIZER_VOCAB, shared, long, seed=1)
    tri = make_engine(config, attention_backend="torch_native" if OPTS.smoke else "triton", dtype="bfloat16", **det)
    cand = run_candidate(tri, warm, batch, starts, new_tokens=16)
    if deterministic:  # the Triton engine against itself: teacher-forced alone vs the generating batch
        res_det = {"triton_solo_vs_batched_bf16": _compare(_solo_reference(tri, warm, cand, starts),
                                                           run_reference(tri, warm, cand, starts))}
    nat16 = make_engine(config, attention_backend="torch_native", dtype="bfloat16", **det)
    ref16 = run_reference(nat16, warm, cand, starts)
    nat_cand = run_candidate(nat16, warm, batch, starts, new_tokens=16)
    res = {"native_vs_native_bf16": _compare(nat_cand, run_reference(nat16, warm, nat_cand, starts)),
           "native_solo_vs_batched_bf16": _compare(_solo_reference(nat16, warm, cand, starts), ref16)}
    nat16.runner.backend.compute_dtype = torch.float64  # exact attention: where float32 attention itself leads
    ref16_exact = run_reference(nat16, warm, cand, starts)
    res.update(native_exact_attention_vs_native_bf16=_compare(ref16_exact, ref16),
               triton_vs_native_exact_attention_bf16=_compare(cand, ref16_exact))
    free(nat16)
    nat32 = make_engine(config, attention_backend="torch_native", dtype="float32", **kw)
    with torch.no_grad():
        for dst, src in zip(nat32.runner.model.parameters(), tri.runner.model.parameters()):
            dst.copy_(src.float())
    free(tri)
    ref32 = run_reference(nat32, warm, cand, starts)
    free(nat32)
    res.update(triton_vs_native_bf16=_compare(cand, ref16), triton_bf16_vs_fp32=_compare(cand, ref32),
               native_bf16_vs_fp32=_compare(ref16, ref32))
    res["ok"] = max(res["triton_vs_native_bf16"]["prefill_max_abs"], res["triton_vs_native_bf16"]["decode_max_abs"]) <= 2e-2
    if deterministic:
        res.update(res_det)
    return res


@contextlib.contextmanager
def _setting(setter, value):
    """setter(value) for the block; setter returns the setting before, which is put back after."""
    before = setter(value)
    try:
        yield
    finally:
        setter(before)


def _set_triton_fused_kernels(on: bool) -> bool:
    """Whether Triton engines created from now on run the model's norm / rotary / SiLU-and-mul as
    Triton kernels (off: in torch, as torch-native's are); returns the setting before."""
    from radixflow.runtime.execution.attention.triton_backend import TritonBackend

    before, TritonBackend.fused_kernels = TritonBackend.fused_kernels, on
    return before


def _check_bf16_p_parts(config: str, parts: int, shared: int, long: int, chunk: int) -> dict:
    """_check_bf16 with the Triton kernels multiplying p in `parts` bf16 parts (kernels/attention_common.py)."""
    from radixflow.kernels.attention_common import set_p_parts

    with _setting(set_p_parts, parts):
        return _check_bf16(config, shared, long, chunk)


def _check_bf16_unfused(config: str, shared: int, long: int, chunk: int) -> dict:
    """_check_bf16 with the Triton engine's rotary and SiLU-and-mul in torch, so the two backends
    differ only in attention."""
    with _setting(_set_triton_fused_kernels, False):
        return _check_bf16(config, shared, long, chunk)


def sec_correctness() -> dict:
    out = {}
    sizes = (SZ["corr_shared"], SZ["corr_long"], SZ["corr_chunk"])
    checks = {"float32": lambda c: _check_backends(c, "float32", 1e-3, *sizes),
              "bfloat16": lambda c: _check_bf16(c, *sizes),
              "bfloat16-det": lambda c: _check_bf16(c, *sizes, deterministic=True),
              "bfloat16-unfused": lambda c: _check_bf16_unfused(c, *sizes),
              **{f"bfloat16-p{n}": (lambda c, n=n: _check_bf16_p_parts(c, n, *sizes)) for n in (1, 2, 3)}}
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


def _decode_rate(eng, prompt: list, n: int, reps: int = 2, **sampling) -> float:
    """Decode tokens/s of one request: (n - 1) / (time(n tokens) - time(1 token)); greedy unless
    `sampling` says otherwise."""
    run = lambda k: wall(lambda: eng.generate(input_ids=[prompt], sampling_params=greedy(k, **sampling)))  # noqa: E731
    run(8)
    t1 = min(run(1) for _ in range(3))
    tn = min(run(n) for _ in range(reps))
    return (n - 1) / (tn - t1)


def _profile_replay(runner, steps: int = 20) -> list:
    from torch.profiler import ProfilerActivity, profile

    g = runner.graph_runner.graphs[1]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            g.replay()
        torch.cuda.synchronize()
    events = prof.key_averages()
    rows = sorted(events, key=lambda e: -getattr(e, "device_time_total", 0))
    with open(os.path.join(OPTS.out, "decode_bs1_profile.txt"), "w") as f:
        for e in rows:
            f.write(f"{getattr(e, 'device_time_total', 0) / steps:10.1f} us/step  {e.count // steps:5d}/step  {e.key}\n")
    return [(e.key[:60], round(getattr(e, "device_time_total", 0) / steps, 1), e.count // steps) for e in rows[:10]]


def _trace_gpu_ops(prof) -> tuple[list, set]:
    """(GPU kernels / memcpys / memsets as (name, start_us, end_us, correlation) by start time,
    correlation ids of the CUDA graph launches) from a profile's chrome trace."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        prof.export_chrome_trace(os.path.join(d, "t.json"))
        with open(os.path.join(d, "t.json")) as f:
            events = json.load(f)["traceEvents"]
    ops = [(e["name"], e["ts"], e["ts"] + e.get("dur", 0), e.get("args", {}).get("correlation"))
           for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    launches = {e.get("args", {}).get("correlation") for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "GraphLaunch" in e.get("name", "")}
    return sorted(ops, key=lambda o: o[1]), launches - {None}


def _busy_us(intervals: list, lo: float, hi: float) -> float:
    """Length of the union of intervals, clipped to [lo, hi]."""
    total, end = 0.0, lo
    for s, e in sorted(intervals):
        s, e = max(s, end), min(e, hi)
        if e > s:
            total, end = total + e - s, e
    return total


def _outside_graph_stats(ops: list, launches: set, graph_names: set, top: int = 15) -> dict:
    """Split a batch-1 decode trace into graph replays and the GPU work outside them. An op is
    inside a replay when its correlation id is a graph launch's (CUPTI gives a graph's kernels
    the id of their cudaGraphLaunch); failing that, when its name occurs in a bare replay, a run
    of consecutive such ops being one replay."""
    groups: dict = {}
    for o in ops:
        if o[3] in launches:
            groups.setdefault(o[3], []).append(o)
    by_corr = len(groups) >= 2
    if by_corr:
        inside = lambda o: o[3] in launches  # noqa: E731
        runs = list(groups.values())
    else:
        inside = lambda o: o[0] in graph_names  # noqa: E731
        runs, run = [], []
        for o in ops:  # an outside op ends a replay unless it overlaps it (another stream)
            if inside(o):
                run.append(o)
            elif run and o[1] >= max(x[2] for x in run):
                runs, run = runs + [run], []
        runs += [run] if run else []
    replays = sorted((min(o[1] for o in r), max(o[2] for o in r), len(r)) for r in runs)
    if len(replays) < 2:
        raise RuntimeError(f"{len(replays)} graph replays in the trace")
    lo, hi, steps = replays[0][0], replays[-1][1], len(replays) - 1
    outside = [o for o in ops if not inside(o) and lo <= o[1] <= hi]
    gaps = [(e0, s1) for (_, e0, _), (s1, _, _) in zip(replays, replays[1:])]
    idle = [s1 - e0 - _busy_us([o[1:3] for o in outside], e0, s1) for e0, s1 in gaps]
    by_name: dict = {}
    for o in outside:
        n, t = by_name.get(o[0], (0, 0.0))
        by_name[o[0]] = (n + 1, t + o[2] - o[1])
    rows = sorted(by_name.items(), key=lambda kv: -kv[1][1])
    med = statistics.median
    return {"method": "graph-launch correlation" if by_corr else "kernel names of a bare replay", "replays": len(replays),
            "ops_per_replay": med(r[2] for r in replays), "replay_us": med(e - s for s, e, _ in replays),
            "step_us": med(b[0] - a[0] for a, b in zip(replays, replays[1:])),
            "gap_us": med(s1 - e0 for e0, s1 in gaps), "idle_us": med(idle), "idle_fraction": sum(idle) / (hi - lo),
            "outside_ops_per_step": len(outside) / steps, "outside_us_per_step": sum(t for _, (_, t) in rows) / steps,
            "outside_names_also_in_graph": sorted(n for n in by_name if n in graph_names)[:5],
            "outside_top": [(n[:80], round(c / steps, 2), round(t / steps, 2)) for n, (c, t) in rows[:top]]}


def _profile_outside_graph(eng, prompt: list, steps: int = 30) -> dict:
    """torch.profiler over ~steps end-to-end decode steps at batch 1 (Engine.generate, overlap as
    configured): what the GPU runs outside the batch-1 graph, and how long it waits. step_us is
    the end-to-end step on the GPU (one replay's start to the next's)."""
    from torch.profiler import ProfilerActivity, profile

    g = eng.runner.graph_runner.graphs[1]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # a bare replay: the graph's kernels
        for _ in range(3):
            g.replay()
        sync()
    bare, _ = _trace_gpu_ops(prof)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # CUDA only (runtime calls included): less host overhead
        eng.generate(input_ids=[prompt], sampling_params=greedy(steps + 2))
        sync()
    out = _outside_graph_stats(*_trace_gpu_ops(prof), {o[0] for o in bare})
    out.update(ops_per_bare_replay=len(bare) / 3, overlap=eng.scheduler.overlap)
    return out


def _recaptured_rates(eng, prompt: list, suffix: str, toggle) -> dict:
    """The same engine with a batch-1 graph captured while `toggle(False)` holds (it returns the
    setting to restore), in the same run: decode tok/s, replay ms, and the largest logit
    difference from the engine's own graph on the same inputs (the last step's)."""
    from radixflow.runtime.execution.cuda_graph_runner import CudaGraphRunner

    runner, g = eng.runner, eng.runner.graph_runner
    before = toggle(False)
    try:
        runner.graph_runner = alt = CudaGraphRunner(runner.model, runner.backend, 1)
    finally:
        toggle(before)
    try:
        out = {f"graph_tok_s_{suffix}": _decode_rate(eng, prompt, SZ["bs1_out"]),
               f"replay_step_ms_{suffix}": cuda_time(lambda: alt.graphs[1].replay(), 50) * 1e3}
        logits = []
        for r in (g, alt):
            for buf in ("input_ids", "positions", "out_cache_loc", "req_pool_indices", "seq_lens"):
                getattr(r, buf)[:1].copy_(getattr(alt, buf)[:1])
            r.graphs[1].replay()
            logits.append(r.logits[1].clone())
        out[f"logits_maxdiff_{suffix}"] = float((logits[0] - logits[1]).abs().max())
    finally:
        runner.graph_runner = g
    return out


def _pdl_off_rates(eng, prompt: list) -> dict:
    """A batch-1 graph captured without PDL (kernels/pdl.py)."""
    from radixflow.kernels import pdl

    return _recaptured_rates(eng, prompt, "pdl_off", pdl.set_enabled)


def _rotary_apart_rates(eng, prompt: list) -> dict:
    """A batch-1 graph with rotary + KV store as their own kernel, not inside decode attention."""
    from radixflow.runtime.execution.attention.triton_backend import TritonBackend

    def toggle(max_batch):  # False: 0, the separate kernel at every batch size; then the old setting back
        before = TritonBackend.rotary_in_decode_attention_max_batch
        TritonBackend.rotary_in_decode_attention_max_batch = int(max_batch)
        return before

    return _recaptured_rates(eng, prompt, "rotary_apart", toggle)


def _pdl_late_rates(eng, prompt: list) -> dict:
    """A batch-1 graph whose kernels trigger the next one after their PDL wait, not before it."""
    from radixflow.kernels import pdl

    return _recaptured_rates(eng, prompt, "pdl_late", pdl.set_early_trigger)


def _set_residual_dtype(dtype):
    """The residual stream's dtype (DecoderLayer.residual_dtype); False: the model's own (bf16).
    Returns the setting before, so it fits _recaptured_rates' toggle protocol."""
    from radixflow.runtime.execution.models.llama import DecoderLayer

    before = DecoderLayer.residual_dtype
    DecoderLayer.residual_dtype = None if dtype is False else dtype
    return before


def _p_parts_rates(eng, prompt: list) -> dict:
    """Batch-1 graphs whose attention multiplies p in each other number of bf16 parts (1 to 3)."""
    from radixflow.kernels.attention_common import p_parts, set_p_parts

    out, default = {}, p_parts(torch.bfloat16)
    for n in sorted({1, 2, 3} - {default}):
        out.update(_recaptured_rates(eng, prompt, f"p{n}", lambda v, n=n: set_p_parts(n if v is False else v)))
    return out


def _residual_bf16_rates(eng, prompt: list) -> dict:
    """A batch-1 graph with the residual stream in bf16 (the model's dtype), not float32."""
    return _recaptured_rates(eng, prompt, "residual_bf16", _set_residual_dtype)


def _gemv_layers(model) -> list:
    """The model's linear layers that run small batches through the Triton GEMV."""
    from radixflow.runtime.execution.layers.parallel_linear import SmallBatchMatmul

    return [m for m in model.modules() if isinstance(m, SmallBatchMatmul) and m.gemv_max_m]


def _gemv_configs_in_use(model) -> list:
    """'(N, K): config' for each GEMV weight shape, as the model's layers now hold them."""
    return sorted({f"{tuple(m.weight.shape)}: {m.gemv_config}" for m in _gemv_layers(model)})


def _forced_config_rates(eng, prompt: list, index: int) -> dict:
    """A batch-1 graph with every GEMV on GEMV_CONFIGS[index], not the chooser's config for its shape."""
    from radixflow.kernels.gemv import GEMV_CONFIGS

    mms = _gemv_layers(eng.runner.model)
    saved = {}

    def toggle(on):  # _recaptured_rates' protocol: toggle(False) sets the config, toggle(its result) restores
        if on is False:
            saved.update({id(m): m.gemv_config for m in mms})
            for m in mms:
                m.gemv_config = GEMV_CONFIGS[index]
            return "restore"
        for m in mms:
            m.gemv_config = saved[id(m)]
        return None

    out = _recaptured_rates(eng, prompt, f"cfg{index}", toggle)
    out["chosen_configs"] = _gemv_configs_in_use(eng.runner.model)
    return out


def sec_gemv_configs() -> dict:
    """Batch-1 decode with the chooser's per-shape GEMV configs against every GEMV on one config
    (GEMV_CONFIGS[1], then [2]), interleaved, twice."""
    eng, out = OPTS.bench_engine, {}
    if eng.runner.graph_runner is None:
        return {"skipped": "no CUDA graphs"}
    prompt = rand_ids(random.Random(7), 128)
    for rep in range(2):
        out[f"chosen_tok_s#{rep}"] = _decode_rate(eng, prompt, SZ["bs1_out"])
        for i in (1, 2):
            out.update({f"{k}#{rep}": v for k, v in _forced_config_rates(eng, prompt, i).items()})
    return out


EXTRA_GEMV_CONFIGS = (
    {"block_n": 4, "block_k": 2048, "num_warps": 8, "stages": 3},
    {"block_n": 2, "block_k": 1024, "num_warps": 4, "stages": 4},
    {"block_n": 8, "block_k": 1024, "num_warps": 8, "stages": 3},
    {"block_n": 4, "block_k": 512, "num_warps": 4, "stages": 4},
)


def sec_gemv_config_search() -> dict:
    """Coordinate descent over the GEMV config of each weight shape (GEMV_CONFIGS and a few more),
    scored by the replay time of a freshly captured batch-1 graph; then the best mix against the
    chooser's, interleaved. Says whether tuning on whole steps would beat the per-shape chooser."""
    from radixflow.kernels.gemv import GEMV_CONFIGS
    from radixflow.runtime.execution.cuda_graph_runner import CudaGraphRunner

    eng = OPTS.bench_engine
    runner, g = eng.runner, eng.runner.graph_runner
    if g is None:
        return {"skipped": "no CUDA graphs"}
    mms = _gemv_layers(runner.model)
    shapes = sorted({tuple(m.weight.shape) for m in mms})
    chosen = {tuple(m.weight.shape): m.gemv_config for m in mms}
    configs = list(GEMV_CONFIGS) + list(EXTRA_GEMV_CONFIGS)

    def step_ms(mix: dict) -> float:
        for m in mms:
            m.gemv_config = mix[tuple(m.weight.shape)]
        graph = CudaGraphRunner(runner.model, runner.backend, 1).graphs[1]
        ms = cuda_time(graph.replay, 30) * 1e3
        gc.collect()  # the previous trial's graph and its memory pool
        return ms

    best, best_ms, trace = dict(chosen), step_ms(chosen), []
    try:
        for sweep in range(2):
            for shape in shapes:
                for cfg in configs:
                    if cfg == best[shape]:
                        continue
                    trial = {**best, shape: cfg}
                    ms = step_ms(trial)
                    trace.append((sweep, str(shape), str(cfg), round(ms, 4)))
                    if ms < best_ms * 0.997:  # beats the current mix by more than noise
                        best, best_ms = trial, ms
        final = {"chosen": [], "best": []}
        for _ in range(5):  # interleaved
            final["chosen"].append(step_ms(chosen))
            final["best"].append(step_ms(best))
    finally:
        for m in mms:
            m.gemv_config = chosen[tuple(m.weight.shape)]
    return {"chosen": {str(k): v for k, v in chosen.items()}, "best": {str(k): v for k, v in best.items()},
            "chosen_ms_median": statistics.median(final["chosen"]), "best_ms_median": statistics.median(final["best"]),
            "final": final, "trace": trace}


def sec_decode_bs1() -> dict:
    eng = OPTS.bench_engine
    runner = eng.runner
    total, read = weight_bytes(runner.model)
    prompt = rand_ids(random.Random(7), 128)
    out = {"weight_GB": total / 1e9, "decode_read_GB": read / 1e9,
           "gemv_configs": _gemv_configs_in_use(runner.model)}
    out["graph_tok_s"] = _decode_rate(eng, prompt, SZ["bs1_out"])
    eng.scheduler.overlap = False
    out["graph_tok_s_overlap_off"] = _decode_rate(eng, prompt, SZ["bs1_out"])
    eng.scheduler.overlap = eng.server_args.overlap_enabled(eng.runner.device)
    g = runner.graph_runner
    if g is not None:
        step = cuda_time(lambda: g.graphs[1].replay(), 50)
        out["replay_step_ms"] = step * 1e3
        out["replay_only_tok_s"] = 1 / step
        out["replay_GBps"] = read / step / 1e9
        out.update(_pdl_off_rates(eng, prompt))
        out.update(_pdl_late_rates(eng, prompt))
        out.update(_rotary_apart_rates(eng, prompt))
        out.update(_residual_bf16_rates(eng, prompt))
        out.update(_p_parts_rates(eng, prompt))
    runner.graph_runner = None
    out["eager_tok_s"] = _decode_rate(eng, prompt, 64, reps=1)
    runner.graph_runner = g
    out.update(_bs1_roofline(runner, out["graph_tok_s"]))
    try:
        if g is not None:
            out["top_kernels_us_per_step"] = _profile_replay(runner)
    except Exception as e:
        out["profile_error"] = repr(e)
    try:
        if g is not None:
            out["outside_graph"] = _profile_outside_graph(eng, prompt)
    except Exception as e:
        out["outside_graph_error"] = repr(e)[:500]
    return out


def _bs1_roofline(runner, tok_s: float) -> dict:
    """Batch-1 decode against the bytes a step must read (weights used, KV of the mean context of
    `_decode_rate`'s request: 128 prompt tokens, 256 out) at the highest bandwidth read in this run."""
    if "_bw" not in RESULTS:
        return {}
    out = {"copy_bw_TBps_now": _copy_bandwidth() / 1e12, "read_bw_TBps_now": _read_bandwidth()}
    bw = max(RESULTS["_bw"], out["copy_bw_TBps_now"] * 1e12, max(out["read_bw_TBps_now"].values()) * 1e12)
    mean_context = 128 + SZ["bs1_out"] / 2
    step = decode_step_read_bytes(runner, mean_context)
    total, read = weight_bytes(runner.model)
    out.update({"roofline_bw_TBps": bw / 1e12, "step_read_GB": step / 1e9, "weights_read_GB": read / 1e9,
                "kv_read_GB": (step - read) / 1e9, "all_params_GB": total / 1e9,
                "roofline_tok_s": bw / step, "pct_of_roofline": 100 * tok_s * step / bw,
                "pct_of_old_roofline_all_params": 100 * tok_s * total / bw})
    return out


def sec_bs1() -> dict:
    """Batch-1 decode (128 in, 256 out, CUDA graphs) against the honest roofline, without decode_bs1's A/B
    settings and profiles; in the bench engine of the section's variant (bs1@fp8: FP8 weights)."""
    eng = OPTS.bench_engine
    g = eng.runner.graph_runner
    out = {"tok_s": _decode_rate(eng, rand_ids(random.Random(7), 128), SZ["bs1_out"], reps=3),
           "gemv_configs": _gemv_configs_in_use(eng.runner.model)}
    if g is not None:
        step = cuda_time(lambda: g.graphs[1].replay(), 50)
        out["replay_step_ms"], out["replay_only_tok_s"] = step * 1e3, 1 / step
        try:
            out["top_kernels_us_per_step"] = _profile_replay(eng.runner)
        except Exception as e:  # noqa: BLE001 - the profile is extra evidence, not the figure
            out["profile_error"] = repr(e)[:300]
    out.update(_bs1_roofline(eng.runner, out["tok_s"]))
    if "replay_only_tok_s" in out and "roofline_tok_s" in out:
        out["replay_pct_of_roofline"] = 100 * out["replay_only_tok_s"] / out["roofline_tok_s"]
    return out


def sec_sampled_bs1() -> dict:
    """Batch-1 decode with temperature 0.8 and top-p 0.9 (the Triton sampling kernel, then torch's
    sort-based path) against greedy, in one engine: what sampling costs a decode step."""
    from radixflow.runtime.scheduling import sampler

    eng, out = OPTS.bench_engine, {}
    prompt = rand_ids(random.Random(7), 128)
    top_p = dict(temperature=0.8, top_p=0.9)
    for rep in range(2):  # interleaved: a slow spell of the machine hits all three
        out[f"greedy_tok_s#{rep}"] = _decode_rate(eng, prompt, SZ["bs1_out"])
        out[f"top_p_kernel_tok_s#{rep}"] = _decode_rate(eng, prompt, SZ["bs1_out"], **top_p)
        before, sampler.triton_sampling = sampler.triton_sampling, False
        try:
            out[f"top_p_torch_tok_s#{rep}"] = _decode_rate(eng, prompt, SZ["bs1_out"], **top_p)
        finally:
            sampler.triton_sampling = before
    return out


def sec_qwen3() -> dict:
    eng = make_engine("qwen3-8b", dtype="bfloat16", max_total_tokens=65536, cuda_graph_max_bs=4)
    try:
        prompt = rand_ids(random.Random(3), 128)
        return {"graph_tok_s": _decode_rate(eng, prompt, SZ["bs1_out"] // 2, reps=1), "bytes_GB": weight_bytes(eng.runner.model)[0] / 1e9}
    finally:
        free(eng)


def _hf_model(config: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(config_path(config))
    with torch.device(DEV):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32 if OPTS.smoke else torch.bfloat16)
    return model.eval()


class TokenClock:
    """A transformers streamer that only timestamps each generated step."""

    def __init__(self):
        self.times: list = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass

    def decode_rate(self) -> float:
        """Tokens/s after the first generated token (times[0] is the prompt)."""
        steps = self.times[1:]
        return (len(steps) - 1) / (steps[-1] - steps[0])


def _hf_generate(model, ids: torch.Tensor, n: int, mask=None, clock=None) -> float:
    """Seconds for n new tokens (EOS suppressed), batch as given."""
    with torch.no_grad():
        return wall(lambda: model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                           do_sample=False, streamer=clock))


def _hf_bs1_rate(model, n: int) -> float:
    ids = torch.tensor([rand_ids(random.Random(7), 128)], device=DEV)
    _hf_generate(model, ids, n)  # warm-up (and, when compiled, compilation)
    clock = TokenClock()
    _hf_generate(model, ids, n, clock=clock)
    return clock.decode_rate()


def sec_hf() -> dict:
    model = _hf_model("llama3-8b")
    out = {"bs1_eager_tok_s": _hf_bs1_rate(model, SZ["hf_bs1_out"])}
    reqs = _offline_requests()[:64]
    longest = max(len(p) for p, _ in reqs)
    pad = [[0] * (longest - len(p)) + p for p, _ in reqs]
    mask = [[0] * (longest - len(p)) + [1] * len(p) for p, _ in reqs]
    steps = max(o for _, o in reqs)
    t = _hf_generate(model, torch.tensor(pad, device=DEV), steps, torch.tensor(mask, device=DEV))
    out["bs64_useful_out_tok_s"] = sum(o for _, o in reqs) / t
    out["bs64_all_out_tok_s"] = len(reqs) * steps / t
    out["bs64_s"] = t
    del model
    free()
    return out


def _hf_compiled_generate(model, ids: torch.Tensor, n: int, cache) -> dict:
    """transformers' own recipe: generate() with a static cache compiles its decode step
    (CompileConfig: inductor, mode="reduce-overhead") and runs the prefill eagerly. Our cache
    object is passed in and reset between calls so its tensors keep their addresses (a new
    cache per call would re-record the CUDA graph)."""
    from transformers import CompileConfig

    cc = CompileConfig(fullgraph=True, mode="reduce-overhead")
    cc._compile_all_devices = DEV == "cpu"  # generate() compiles on CPU only when told to (smoke)

    def run(k: int, clock=None):
        cache.reset()
        with torch.no_grad():
            return model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, compile_config=cc,
                                  max_new_tokens=k, min_new_tokens=k, do_sample=False, streamer=clock)

    warm = wall(lambda: run(8))  # compiles, then records the CUDA graph
    clock = TokenClock()
    tokens = run(n, clock)[0, ids.shape[1]:]
    return {"warmup_s": warm, "tok_s": clock.decode_rate(), "tokens": tokens.tolist()}


def _hf_compiled_loop(model, ids: torch.Tensor, n: int, cache) -> dict:
    """A greedy loop of our own over the static cache: the prefill eager (the cache's first
    write must not happen inside a CUDA graph's memory pool, which is what broke compiling
    model.forward whole), the decode step (forward + argmax) compiled with
    mode="reduce-overhead", fullgraph=True; cudagraph_mark_step_begin() before each step and
    the next token cloned out of the graph's output."""

    def step(tok, pos):
        logits = model(input_ids=tok, position_ids=pos, past_key_values=cache, use_cache=True).logits
        return logits[:, -1].argmax(-1, keepdim=True)

    step_c = torch.compile(step, mode="reduce-overhead", fullgraph=True)

    def run(k: int) -> tuple[list, float]:
        """(tokens, decode tok/s after the first token)"""
        cache.reset()
        with torch.no_grad():
            tok = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
            pos, out = torch.full((1, 1), ids.shape[1], device=DEV), [tok]
            sync()
            t = time.perf_counter()
            for _ in range(k - 1):
                torch.compiler.cudagraph_mark_step_begin()
                out.append(step_c(out[-1], pos).clone())
                pos += 1
            sync()
            return torch.cat(out, 1)[0].tolist(), (k - 1) / (time.perf_counter() - t)

    warm = wall(lambda: run(8))
    tokens, rate = run(n)
    return {"warmup_s": warm, "tok_s": rate, "tokens": tokens}


HF_COMPILE = {"generate": _hf_compiled_generate, "loop": _hf_compiled_loop}


def sec_hf_compile() -> dict:
    """transformers batch 1, static cache + torch.compile(mode='reduce-overhead'): each approach of
    --hf-compile in turn until one runs. warmup_s (compilation and graph recording) is one
    8-token call; tok_s is the rate after the first token, like sec_hf (generate: per-token
    timestamps, one host sync per token; loop: no sync until the end)."""
    from transformers import StaticCache

    model = _hf_model("llama3-8b")
    n = SZ["hf_compile_out"]
    ids = torch.tensor([rand_ids(random.Random(7), 128)], device=DEV)
    with torch.no_grad():  # eager greedy tokens, to check the compiled ones against
        eager = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, ids.shape[1]:].tolist()
    out = {"new_tokens": n, "approach": None, "failed": {}}
    for name in OPTS.hf_compile.split(","):
        torch._dynamo.reset()
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        cache = StaticCache(config=model.config, max_cache_len=ids.shape[1] + n + 8)
        t = time.perf_counter()
        try:
            res = HF_COMPILE[name](model, ids, n, cache)
        except Exception as e:  # the next approach runs
            out["failed"][name] = {"error": repr(e)[:800], "after_s": round(time.perf_counter() - t, 1),
                                   "trace": traceback.format_exc()[-1500:]}
            log(f"hf_compile {name} failed after {time.perf_counter() - t:.0f}s: {e!r}"[:600])
            continue
        tokens = res.pop("tokens")
        same = next((i for i, (a, b) in enumerate(zip(tokens, eager)) if a != b), min(len(tokens), len(eager)))
        out.update(approach=name, bs1_compiled_static_tok_s=res["tok_s"], warmup_s=res["warmup_s"],
                   wall_s=time.perf_counter() - t, leading_tokens_equal_to_eager=same,
                   dynamo_graphs=torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs)  # 1: no recompiles
        break
    del model
    free()
    return out


def _offline_requests(seed: int = 2024) -> list:
    rng = random.Random(seed)
    return [(rand_ids(rng, rng.randint(32, SZ["in_max"])), rng.randint(32 if not OPTS.smoke else 2, SZ["out_max"]))
            for _ in range(SZ["offline"])]


def _run_batch(eng, prompts: list, params: list) -> dict:
    eng.flush_cache()
    st = eng.scheduler.stats
    before = (st.prompt_tokens, st.cached_tokens)
    t = time.perf_counter()
    res = eng.generate(input_ids=prompts, sampling_params=params)
    dt = time.perf_counter() - t
    out_tokens = sum(r["meta_info"]["completion_tokens"] for r in res)
    prompt, cached = st.prompt_tokens - before[0], st.cached_tokens - before[1]
    return {"s": dt, "out_tokens": out_tokens, "out_tok_s": out_tokens / dt,
            "total_tok_s": (out_tokens + sum(map(len, prompts))) / dt, "cache_hit": cached / max(prompt, 1)}


class ForwardRecorder:
    """Wraps runner.forward: GPU time of every forward pass (events) and host timestamps."""

    def __init__(self, runner):
        self.runner, self.records = runner, []
        orig = runner.forward

        def timed(fb):
            s, e = Event(), Event()
            s.record()
            logits = orig(fb)
            e.record()
            self.records.append((fb.mode.value, fb.batch_size, s, e, time.perf_counter()))
            return logits

        runner.forward = timed

    def close(self) -> None:
        del self.runner.forward
        sync()

    def summary(self) -> dict:
        out = {}
        for mode in ("extend", "decode"):
            recs = [r for r in self.records if r[0] == mode]
            if recs:
                out[f"{mode}_steps"] = len(recs)
                out[f"{mode}_gpu_s"] = sum(s.elapsed_time(e) for _, _, s, e, _ in recs) / 1e3
        dec = [r for r in self.records if r[0] == "decode"]
        if dec:
            out["decode_mean_bs"] = sum(r[1] for r in dec) / len(dec)
        if len(self.records) > 1:
            first, last = self.records[0], self.records[-1]
            out["gpu_window_s"] = first[2].elapsed_time(last[3]) / 1e3
        return out


def _offline_pass(eng, reqs: list) -> dict:
    rec = ForwardRecorder(eng.runner)
    try:
        res = _run_batch(eng, [p for p, _ in reqs], [greedy(o) for _, o in reqs])
    finally:
        rec.close()
    res.update(rec.summary())
    return res


def sec_offline() -> dict:
    """The workload twice; the second pass is the figure. The first pass of a process compiles
    Triton kernels for shapes it has not seen (s6 run 4: 9,318 out tok/s first, then 10,385 and
    10,428), which a server pays once at start-up, not per workload; it is kept as "cold"."""
    eng = OPTS.bench_engine
    seeds = [int(x) for x in OPTS.offline_seeds.split(",")]
    cold = _offline_pass(eng, _offline_requests(seeds[0]))
    res = {"cold": {k: cold[k] for k in ("s", "out_tok_s", "extend_gpu_s", "decode_gpu_s") if k in cold}}
    for seed in seeds:
        res[f"seed{seed}"] = _offline_pass(eng, _offline_requests(seed))
    rates = [res[f"seed{seed}"]["out_tok_s"] for seed in seeds]
    res.update(out_tok_s=statistics.median(rates), out_tok_s_min=min(rates), out_tok_s_max=max(rates))
    return res


def sec_offline_1k() -> dict:
    """1,000 requests of 1,000 random prompt tokens and 1,000 output tokens (ignore_eos), one pass after a
    warm-up of 64 requests of the same shape that compiles what the shapes need."""
    eng = OPTS.bench_engine
    rng = random.Random(1000)
    n, length, out_len = SZ["k1_n"], SZ["k1_len"], SZ["k1_len"]
    _run_batch(eng, [rand_ids(rng, length) for _ in range(min(n, 64))], [greedy(32)] * min(n, 64))
    reqs = [(rand_ids(rng, length), out_len) for _ in range(n)]
    res = _offline_pass(eng, reqs)
    res["kv_pool_tokens"] = eng.runner.kv_pool.allocator.capacity_slots
    return res


def sec_offline_pdl_ab() -> dict:
    """`offline` (warm passes) with every CUDA graph captured with the PDL trigger before the wait
    (early, the default), then after it (late), then early again, in one process, so the
    machine's bandwidth is the same for both settings."""
    from radixflow.kernels import pdl

    runner, out = OPTS.bench_engine.runner, {}
    for label, early in (("early", True), ("late", False), ("early_again", True)):
        before = pdl.set_early_trigger(early)
        try:
            runner.recapture_cuda_graphs()
        finally:
            pdl.set_early_trigger(before)
        out[label] = sec_offline()
    return out


def _offline_settings_ab(setter, settings: tuple) -> dict:
    """`offline` once per (label, value) in `settings`, with setter(value) holding for the whole run
    (eager passes and recaptured graphs), in one process; the setting before is restored after."""
    runner, out = OPTS.bench_engine.runner, {}
    before = setter(settings[0][1])
    try:
        for label, value in settings:
            setter(value)
            runner.recapture_cuda_graphs()
            out[label] = sec_offline()
    finally:
        setter(before)
        runner.recapture_cuda_graphs()
    return out


def sec_offline_residual_ab() -> dict:
    """`offline` with the residual stream in float32 (the default), in bf16, then float32 again:
    what the float32 stream costs at large batches."""
    return _offline_settings_ab(_set_residual_dtype,
                                (("float32", torch.float32), ("bf16", False), ("float32_again", torch.float32)))


def sec_offline_p_parts_ab() -> dict:
    """`offline` with attention's p in 2, 3, then 2 bf16 parts again."""
    from radixflow.kernels.attention_common import set_p_parts

    return _offline_settings_ab(set_p_parts, (("p2", 2), ("p3", 3), ("p2_again", 2)))


def sec_shared() -> dict:
    """Radix cache on (twice: the first pass of a fresh engine compiles Triton kernels for the
    long-prefix shapes, s9 run 5: 6.24 s, then 5.28 s warm in s9 run 6; kept as "radix_on_cold"),
    then off in a fresh engine of the same process (the kernels compiled by then)."""
    rng = random.Random(5)
    common = rand_ids(rng, SZ["shared_len"])
    prompts = [common + rand_ids(rng, 128) for _ in range(SZ["shared_n"])]
    params = [greedy(SZ["shared_out"])] * len(prompts)
    out = {"radix_on_cold": _run_batch(OPTS.bench_engine, prompts, params)}
    out["radix_on"] = _run_batch(OPTS.bench_engine, prompts, params)
    log(f"shared radix on: {out['radix_on']}")
    free(OPTS.bench_engine)  # the radix-off engine sizes its KV pool from the free memory
    OPTS.bench_engine = None
    eng = make_engine("llama3-8b", disable_radix_cache=True, **OPTS.bench_kw)
    try:
        out["radix_off"] = _run_batch(eng, prompts, params)
    finally:
        free(eng)
    out["speedup"] = out["radix_off"]["s"] / out["radix_on"]["s"]
    return out


def _host_profile(eng, prompts: list, params: list) -> list:
    """cProfile of the engine loop (host side), top functions by cumulative time."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    _run_batch(eng, prompts, params)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(45)
    with open(os.path.join(OPTS.out, "idle_host_profile.txt"), "w") as f:
        f.write(buf.getvalue())
    stats = pstats.Stats(prof).stats
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:12]  # by own (total) time
    return [(f"{os.path.basename(k[0])}:{k[2]}", round(v[2], 3), v[1]) for k, v in rows]


def _idle_run(eng, prompts: list, params: list) -> dict:
    bs = len(prompts)
    rec = ForwardRecorder(eng.runner)
    try:
        res = _run_batch(eng, prompts, params)
    finally:
        rec.close()
    dec = [r for r in rec.records if r[0] == "decode" and r[1] == bs]
    busy = [s.elapsed_time(e) for _, _, s, e, _ in dec]
    gaps = [a[3].elapsed_time(b[2]) for a, b in zip(dec, dec[1:])]
    host = [b[4] - a[4] for a, b in zip(dec, dec[1:])]
    return {"decode_steps": len(dec), "gpu_forward_ms": statistics.median(busy), "gap_ms": statistics.median(gaps),
            "host_step_ms": 1e3 * statistics.median(host), "idle_fraction": sum(gaps) / (sum(gaps) + sum(busy[1:])),
            "out_tok_s": res["out_tok_s"]}


def sec_idle() -> dict:
    """GPU idle between decode steps at batch idle_bs: overlap scheduling on (the default
    on CUDA) and off, in the same run."""
    eng = OPTS.bench_engine
    rng = random.Random(11)
    bs = SZ["idle_bs"]
    prompts, params = [rand_ids(rng, 128) for _ in range(bs)], [greedy(SZ["idle_out"])] * bs
    sched = eng.scheduler
    out = {}
    for name, on in (("overlap_off", False), ("overlap_on", True)):
        sched.overlap = on
        out[name] = _idle_run(eng, prompts, params)
    out["host_top_self_s"] = _host_profile(eng, prompts, params)
    return out


def _prefill_seconds(eng, rng: random.Random, n: int, length: int) -> float:
    """The fastest of 3 batches of n fresh random prompts of `length` tokens, 1 output token each,
    after one batch that compiles what the shapes need."""
    _run_batch(eng, [rand_ids(rng, length) for _ in range(n)], [greedy(1)] * n)
    return min(_run_batch(eng, [rand_ids(rng, length) for _ in range(n)], [greedy(1)] * n)["s"] for _ in range(3))


def sec_prefill() -> dict:
    eng = OPTS.bench_engine
    n, length = SZ["prefill_n"], SZ["prefill_len"]
    t = _prefill_seconds(eng, random.Random(13), n, length)
    model = eng.runner.model
    s = model.shape
    flops = prefill_flops(model, n, length)
    old_count = n * length * (2 * weight_bytes(model)[1] // 2 + 4 * s.num_layers * (length // 2) * s.num_heads * s.head_dim)
    out = {"s": t, "tok_s": n * length / t, "tflops": flops / t / 1e12, "tflops_old_count": old_count / t / 1e12}
    rate = RESULTS.get("_mm8") if OPTS.variant_kw.get("quantization") == "fp8" else RESULTS.get("_mm")
    if rate:
        out["pct_of_matmul_rate"] = 100 * out["tflops"] * 1e12 / rate
        out["pct_of_matmul_rate_old_count"] = 100 * out["tflops_old_count"] * 1e12 / rate
    if OPTS.prefill_p_parts_ab:
        out.update(_prefill_p_parts_ab(eng, n, length))
    return out


def _prefill_p_parts_ab(eng, n: int, length: int) -> dict:
    """Prefill tok/s with p in 1, 2 and 3 bf16 parts, then the default again, in the same engine."""
    from radixflow.kernels.attention_common import p_parts, set_p_parts

    rng, out, default = random.Random(17), {}, p_parts(torch.bfloat16)
    for label, parts in (("p1", 1), ("p2", 2), ("p3", 3), ("default_again", default)):
        with _setting(set_p_parts, parts):
            out[f"tok_s_{label}"] = n * length / _prefill_seconds(eng, rng, n, length)
    return out


def sec_deterministic() -> dict:
    """--enable-deterministic-inference against the default, Llama-3-8B shape, one engine at a time:
    batch-1 decode (128 in, 256 out), a batch of 64 (in 512, out 128) and `prefill`'s 8 x 2,048 prompts;
    plus whether a request's outputs and logprobs are the same bits alone and inside that batch."""
    rng = random.Random(21)
    prompt, batch = rand_ids(rng, 128), [rand_ids(rng, 512) for _ in range(64)]
    out = {}
    for label, det in (("default", False), ("deterministic", True)):
        eng = make_engine("llama3-8b", **dict(OPTS.bench_kw, cuda_graph_max_bs=64, max_running_requests=64,
                                              enable_deterministic_inference=det))
        res = {"bs1_tok_s": _decode_rate(eng, prompt, SZ["bs1_out"])}
        _run_batch(eng, batch, [greedy(SZ["shared_out"])] * 64)  # warm-up
        res["bs64_out_tok_s"] = 64 * SZ["shared_out"] / _run_batch(eng, batch, [greedy(SZ["shared_out"])] * 64)["s"]
        n, length = SZ["prefill_n"], SZ["prefill_len"]
        res["prefill_tok_s"] = n * length / _prefill_seconds(eng, random.Random(13), n, length)
        lp = dict(sampling_params=greedy(32), return_logprob=True)
        eng.flush_cache()
        alone = eng.generate(input_ids=batch[5], **lp)
        eng.flush_cache()
        together = eng.generate(input_ids=batch[:24], **lp)[5]
        res["alone_equals_batched"] = alone["meta_info"]["output_token_logprobs"] == together["meta_info"]["output_token_logprobs"]
        free(eng)
        out[label] = res
    out["bs1_ratio"] = out["deterministic"]["bs1_tok_s"] / out["default"]["bs1_tok_s"]
    out["bs64_ratio"] = out["deterministic"]["bs64_out_tok_s"] / out["default"]["bs64_out_tok_s"]
    out["prefill_ratio"] = out["deterministic"]["prefill_tok_s"] / out["default"]["prefill_tok_s"]
    return out


SECTIONS = {
    "env": sec_env, "ceilings": sec_ceilings, "pytest": sec_pytest, "correctness": sec_correctness,
    "tiny_ckpt": sec_tiny_ckpt, "qwen3": sec_qwen3, "hf": sec_hf, "hf_compile": sec_hf_compile, "decode_bs1": sec_decode_bs1,
    "sampled_bs1": sec_sampled_bs1,
    "gemv_configs": sec_gemv_configs,
    "gemv_config_search": sec_gemv_config_search,
    "offline": sec_offline, "offline_pdl_ab": sec_offline_pdl_ab, "offline_residual_ab": sec_offline_residual_ab,
    "offline_p_parts_ab": sec_offline_p_parts_ab,
    "shared": sec_shared, "idle": sec_idle, "prefill": sec_prefill, "deterministic": sec_deterministic,
    "bs1": sec_bs1, "offline_1k": sec_offline_1k,
}
# "section@variant" runs the section in a bench engine built with these settings (default: bf16)
VARIANTS = {"bf16": {}, "fp8": {"quantization": "fp8"}, "kv8": {"kv_cache_dtype": "fp8_e4m3"},
            "fp8kv8": {"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"}}
NEEDS_BENCH_ENGINE = {"bs1", "offline_1k", "offline", "offline_pdl_ab", "offline_residual_ab", "offline_p_parts_ab", "shared", "idle", "prefill", "decode_bs1", "sampled_bs1",
                      "gemv_configs", "gemv_config_search"}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/bench-out"))
    p.add_argument("--tokenizer", default=os.path.join(ROOT, ".gpu_assets", "tokenizer"))
    p.add_argument("--sections", default="env,ceilings,pytest,correctness,tiny_ckpt,decode_bs1")
    p.add_argument("--max-running", type=int, default=1024)
    p.add_argument("--graph-max-bs", type=int, default=256)
    p.add_argument("--smoke", action="store_true", help="CPU, tiny model, tiny sizes: checks the plumbing only")
    p.add_argument("--corr-dtypes", default="float32,bfloat16",
                   help="correctness checks: float32, bfloat16, bfloat16-det, bfloat16-unfused, bfloat16-p1, bfloat16-p2, bfloat16-p3")
    p.add_argument("--corr-configs", default="smollm2-135m,llama3-8b")
    p.add_argument("--p-parts", type=int, choices=(1, 2, 3),
                   help="Triton attention multiplies p in this many bf16 parts for the whole run (default: the kernels' own)")
    p.add_argument("--offline-seeds", default="2024,2025,2026", help="offline: one warm pass per workload seed")
    p.add_argument("--prefill-p-parts-ab", action="store_true", help="prefill: also time p in 1, 2, 3 parts")
    p.add_argument("--hf-compile", default="generate,loop", help="hf_compile approaches, tried in order until one runs")
    p.parse_args(namespace=OPTS)
    SZ.update(SMOKE if OPTS.smoke else {})
    if OPTS.p_parts:
        from radixflow.kernels.attention_common import set_p_parts

        set_p_parts(OPTS.p_parts)
    os.makedirs(OPTS.out, exist_ok=True)
    OPTS.bench_engine = None
    OPTS.bench_kw = dict(dtype="bfloat16", max_running_requests=OPTS.max_running, cuda_graph_max_bs=OPTS.graph_max_bs,
                         chunked_prefill_size=8192, max_prefill_tokens=16384)
    OPTS.bench_variant = None
    for label in OPTS.sections.split(","):
        name, _, variant = label.partition("@")
        variant = variant or "bf16"
        uses_bench = name in NEEDS_BENCH_ENGINE
        if OPTS.bench_engine is not None and (not uses_bench or variant != OPTS.bench_variant):
            free(OPTS.bench_engine)  # its KV pool holds most of the GPU memory
            OPTS.bench_engine = None
        OPTS.variant_kw = VARIANTS[variant]
        if uses_bench and OPTS.bench_engine is None:
            free()  # earlier sections' memory back to the driver before the KV pool is sized
            OPTS.bench_engine = make_engine("llama3-8b", **OPTS.bench_kw, **OPTS.variant_kw)
            OPTS.bench_variant = variant
        runs = sum(k.split("#")[0] == label and not k.endswith("_wall_s") for k in RESULTS)
        key = f"{label}#{runs}" if runs else label
        t = time.perf_counter()
        try:
            RESULTS[key] = SECTIONS[name]()
        except Exception as e:
            RESULTS[key] = {"error": repr(e), "trace": traceback.format_exc()[-3000:]}
        RESULTS[key + "_wall_s"] = round(time.perf_counter() - t, 1)
        log(f"{key} ({RESULTS[key + '_wall_s']}s): {json.dumps(RESULTS[key], default=str)[:3000]}")
        save()
    print_table()


def print_table() -> None:
    print("\n==== summary ====")
    for name, res in RESULTS.items():
        if name.startswith("_") or name.endswith("_wall_s"):
            continue
        if isinstance(res, dict):
            flat = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.items() if k not in ("trace", "nvidia_smi")}
            print(f"{name:12s} {json.dumps(flat, default=str)[:600]}")


if __name__ == "__main__":
    main()
