"""One script for the GPU machine: correctness of the Triton path, then benchmarks.

    python3 benchmarks/gpu_bench.py --out $OUT --sections env,ceilings,pytest,correctness,decode_bs1
    python benchmarks/gpu_bench.py --smoke --sections offline,idle   # CPU: tiny model, plumbing only

The tokenizer (default: .gpu_assets/tokenizer, a git-ignored copy of the default model's
tokenizer files, carried to the GPU machine) only has to cover the random prompt ids.

Sections (each isolated: a failure is logged and the next one runs):
  env          versions, GPU, whether server/grammar packages are missing
  ceilings     HBM copy bandwidth and bf16 matmul rate, measured here
  matmul_rate  the bf16 matmul rate alone
  pytest       tests/test_fp8.py, then tests/test_kernels.py on the GPU (GPU-only tests included), --pytest-timeout
  correctness  Triton vs torch-native teacher-forced logprobs (SmolLM2 and Llama-3-8B shapes,
               float32 and bf16, dummy weights), mixed fresh / cache-hit / chunked batch; in bf16
               also torch-native vs itself (as candidate; each request alone vs batched);
               --corr-dtypes bfloat16-det (deterministic inference), bfloat16-p1|p2 (p in N parts),
               bfloat16-unfused (Triton's rotary and SiLU-and-mul in torch), bfloat16-flash (Triton vs
               torch-native in bf16 with prompt-only prefill rows through torch's flash kernel, and without)
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
  bs1          batch-1 decode against the bytes a step must read (weights used, KV), and the GEMV-only bound
               (every linear and the head back to back in a graph); a folded model (layers/norm_fold.py) also A/Bs its graph with
               the GEMV epilogues against one without them, interleaved twice
  offline_pdl_ab / offline_residual_ab / offline_p_parts_ab   offline under each of two or three settings
  shared       256 x (4096 shared + 128) -> 128 out, radix on vs off
  idle         GPU idle fraction between decode steps at batch 64
  prefill      8 x 2048-token prompts vs the measured matmul rate, FLOPs counted as computed (the output
               head for last tokens only); --prefill-p-parts-ab also times p in 1 and 2 parts,
               --prefill-flash-ab prompt-only rows through the Triton extend kernel, then torch's flash kernel;
               --prefill-cudnn-ab equal-length prompt passes through the flash kernel, then cuDNN's (kernels/cudnn_dense.py)
  prefill_profile  prefill 8 x 2,048: best wall time, the extend passes' GPU time, then one batch under torch.profiler
               (PDL off): GPU ms per 8,192-token chunk by group and kernel, the GEMMs' TFLOP/s (run @nofold too)
  prefill_kernels  a chunk's non-GEMM kernels alone at 8,192 rows: SiLU-and-mul over plain / interleaved rows (the
               current kernel and session 11's stride-2 one), RMSNorm with the residual add, the four linears
  offline_flash_ab  offline with prompt-only prefill rows through torch's flash kernel, then the Triton kernel
  offline_arms offline (every seed) as built, then with 16,384-token prefill chunks
  offline_decode_ab  offline (every seed) with no `bf16` entry in DECODE_CONFIG (4 warps), then with --decode-entry's
               (bf16_attn_bench.py's pick; without the flag, DECODE_CONFIG's own), decode graphs recaptured per arm
  gemm_shapes  the bf16 linears' GEMMs alone (Llama-3-8B shapes, M 544 to 8,192): F.linear against the weight in
               two GEMMs (split_linear), stored transposed, and through cuBLASLt
  gemm_row_blocks  the same shapes at 8,192 rows: one GEMM against one per block of 1,024-4,096 rows
  fp8_kernels  the FP8 kernels alone (--fp8-kernels picks gemv, gemm, gemm_m, attention, quantize): each GEMV config
               per Llama-3-8B weight shape at batch 1 (FP8 and bf16 weights), the FP8 GEMM and its parts
               against bf16 at batches 256-1,024 and 8,192, the activation quantization alone, decode
               attention at batch 256 / 512 over a bf16 pool and an FP8 one (float16 or bf16 products)
  deterministic  --enable-deterministic-inference vs default: batch 1 and 64 decode, prefill 8 x 2,048, alone vs batched
  step_profile decode at batch 512 over ~640-token contexts under torch.profiler: GPU time per step by kernel
               and by group (GEMM, attention, FP8 quantization, norms / activations, sampling, other); and a
               prefill chunk's per 1,000 tokens
  prefill_attention  the Triton extend kernel against torch's flash attention (packed, variable length) on
               prompt-only chunks (an offline-like 8,192-token chunk, 4 x 2,048): error vs the reference, us, TFLOP/s
  extend_graph_buckets  small extend passes (64 x 7 tokens over 600 cached, ...) replayed from their extend CUDA
               graph (512 tokens / 64 requests) against the same pass eagerly: CUDA-event ms, and kernel ms with the
               Triton extend-attention kernel's share (is a bucket-bound grid's waste a cost?)
  decode_graphs the same decode without the profiler, from CUDA graphs and eagerly above 256, in one engine
               (needs graphs up to batch 512: the default)
  decode_sweep decode at each --sweep-batches batch over ~prof_len-token contexts: step_profile's kernel groups
               (PDL off) and the served step's GPU ms (PDL on) against the bytes-read / dense-FLOP bound
  decode_gemm  the four bf16 linears at 16-200 rows: cuBLAS, cuBLASLt and the batch-invariant Triton GEMM, us
               and share of the bytes / FLOP bound
A section named twice runs twice (results under name, name#1, ...). A bench-engine section
runs in a variant's engine when named section@variant: bf16 (default), fp8 (FP8 weights), kv8
(FP8 KV cache), fp8kv8 (both), nofold / fp8nofold (--disable-gemv-epilogue: the norm weights not folded), ratio /
fp8kv8ratio (--admission-rule ratio: SGLang's admission estimate, the rule before the peak rule), fp8exact /
fp8kv8exact (--disable-fp8-fast-accum: the FP8 GEMMs' partial sums in float32, the default before session 33),
fp8kv8r512 (FP8 weights + FP8 KV with --max-running-requests 512: every decode batch within one wave of the
row-wise FP8 GEMM's tiles for o_proj and down; a variant's settings replace --max-running's),
e.g. --sections ceilings,bs1,bs1@fp8,offline,offline@fp8. Results go to
OUT/results.json and OUT/bench.log; a table is printed last.

The sections live by topic in benchmarks/gpubench/ (machine, correctness, decode, gemv_configs, hf,
offline, prefill) over the shared plumbing in gpubench/common.py; this file picks and runs them.
"""

from __future__ import annotations

import time

START = time.perf_counter()  # --deadline-s counts from here, before the imports below (torch alone takes seconds)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from gpubench.common import OPTS, RESULTS, SMOKE, SZ, free, log, make_engine, parse_sizes, past_deadline, save  # noqa: E402
from gpubench.correctness import sec_correctness, sec_tiny_ckpt  # noqa: E402
from gpubench.decode import sec_bs1, sec_decode_bs1, sec_qwen3, sec_sampled_bs1  # noqa: E402
from gpubench.decode_gemm import sec_decode_gemm  # noqa: E402
from gpubench.extend_graphs import sec_extend_graph_buckets  # noqa: E402
from gpubench.fp8_kernels import fp8_kernel_parts, sec_fp8_kernels  # noqa: E402
from gpubench.gemm_shapes import sec_gemm_shapes  # noqa: E402
from gpubench.gemv_configs import sec_gemv_config_search, sec_gemv_configs  # noqa: E402
from gpubench.hf import sec_hf, sec_hf_compile  # noqa: E402
from gpubench.machine import sec_ceilings, sec_env, sec_matmul_rate, sec_pytest  # noqa: E402
from gpubench.memory import sec_logprob_peak, sec_memory  # noqa: E402
from gpubench.offline import (  # noqa: E402
    decode_entry, sec_idle, sec_offline, sec_offline_1k, sec_offline_arms, sec_offline_flash_ab, sec_offline_decode_ab, sec_offline_p_parts_ab, sec_offline_pdl_ab, sec_offline_residual_ab, sec_shared,
)
from gpubench.row_blocks import sec_gemm_row_blocks  # noqa: E402
from gpubench.prefill import sec_deterministic, sec_prefill  # noqa: E402
from gpubench.prefill_attention import sec_prefill_attention  # noqa: E402
from gpubench.prefill_profile import sec_prefill_kernels, sec_prefill_profile  # noqa: E402
from gpubench.step_profile import sec_decode_graphs, sec_decode_sweep, sec_step_profile  # noqa: E402


SECTIONS = {
    "env": sec_env, "ceilings": sec_ceilings, "matmul_rate": sec_matmul_rate, "pytest": sec_pytest, "correctness": sec_correctness,
    "tiny_ckpt": sec_tiny_ckpt, "qwen3": sec_qwen3, "hf": sec_hf, "hf_compile": sec_hf_compile, "decode_bs1": sec_decode_bs1,
    "sampled_bs1": sec_sampled_bs1,
    "gemv_configs": sec_gemv_configs,
    "gemv_config_search": sec_gemv_config_search,
    "offline": sec_offline, "offline_pdl_ab": sec_offline_pdl_ab, "offline_residual_ab": sec_offline_residual_ab,
    "offline_p_parts_ab": sec_offline_p_parts_ab, "offline_flash_ab": sec_offline_flash_ab,
    "offline_arms": sec_offline_arms, "offline_decode_ab": sec_offline_decode_ab, "gemm_shapes": sec_gemm_shapes,
    "shared": sec_shared, "idle": sec_idle, "prefill": sec_prefill, "deterministic": sec_deterministic,
    "bs1": sec_bs1, "offline_1k": sec_offline_1k, "fp8_kernels": sec_fp8_kernels, "step_profile": sec_step_profile,
    "decode_graphs": sec_decode_graphs, "decode_sweep": sec_decode_sweep, "decode_gemm": sec_decode_gemm,
    "prefill_attention": sec_prefill_attention,
    "extend_graph_buckets": sec_extend_graph_buckets,
    "gemm_row_blocks": sec_gemm_row_blocks, "prefill_profile": sec_prefill_profile, "prefill_kernels": sec_prefill_kernels,
    "memory": sec_memory, "logprob_peak": sec_logprob_peak,
}
# "section@variant" runs the section in a bench engine built with these settings (default: bf16)
VARIANTS = {"bf16": {}, "fp8": {"quantization": "fp8"}, "kv8": {"kv_cache_dtype": "fp8_e4m3"},
            "fp8kv8": {"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"},
            "nofold": {"disable_gemv_epilogue": True}, "fp8nofold": {"quantization": "fp8", "disable_gemv_epilogue": True},
            "ratio": {"admission_rule": "ratio"},
            "fp8kv8ratio": {"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3", "admission_rule": "ratio"},
            "fp8kv8nofq": {"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3",
                           "kernel_settings": {"fp8_fused_quantize": False}},
            "fp8nofq": {"quantization": "fp8", "kernel_settings": {"fp8_fused_quantize": False}},
            "fp8exact": {"quantization": "fp8", "disable_fp8_fast_accum": True},
            "fp8kv8exact": {"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3", "disable_fp8_fast_accum": True},
            "fp8kv8r512": {"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3", "max_running_requests": 512}}
NEEDS_BENCH_ENGINE = {"bs1", "offline_1k", "offline", "offline_arms", "offline_decode_ab", "offline_flash_ab", "offline_pdl_ab", "offline_residual_ab", "offline_p_parts_ab", "shared", "idle", "prefill", "decode_bs1", "sampled_bs1",
                      "gemv_configs", "gemv_config_search", "step_profile", "decode_graphs", "decode_sweep", "prefill_profile", "memory",
                      "logprob_peak"}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/bench-out"))
    p.add_argument("--tokenizer", default=os.path.join(ROOT, ".gpu_assets", "tokenizer"))
    p.add_argument("--sections", default="env,ceilings,pytest,correctness,tiny_ckpt,decode_bs1")
    p.add_argument("--max-running", type=int, default=1024)
    p.add_argument("--graph-max-bs", type=int, default=None,
                   help="bench engines' cuda_graph_max_bs (default: the engine's own, every batch up to --max-running; "
                        "the default was 256 before, so older figures ran larger decode batches eagerly)")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny model, tiny sizes: checks the plumbing only")
    p.add_argument("--sizes", default="", help="workload sizes to change, e.g. prof_n=800,prof_len=600 "
                   "(the names and defaults: SIZES in gpubench/common.py)")
    p.add_argument("--mem-fraction-static", type=float, default=None,
                   help="bench engines' --mem-fraction-static (default: the engine's own)")
    p.add_argument("--corr-dtypes", default="float32,bfloat16",
                   help="correctness checks: float32, bfloat16, bfloat16-det, bfloat16-unfused, bfloat16-p1, bfloat16-p2")
    p.add_argument("--corr-configs", default="smollm2-135m,llama3-8b")
    p.add_argument("--p-parts", type=int, choices=(1, 2),
                   help="Triton attention multiplies p in this many bf16 parts for the whole run (default: the kernels' own)")
    p.add_argument("--offline-seeds", default="2024,2025,2026", help="offline: one warm pass per workload seed")
    p.add_argument("--offline-warmup", type=int, default=0,
                   help="offline: the cold pass runs only the first N requests of the first seed (0: all of them)")
    p.add_argument("--decode-entry", default="",
                   help="offline_decode_ab: a JSON file whose `entry` is the `bf16` entry for DECODE_CONFIG to time "
                        "against no entry (benchmarks/bf16_attn_bench.py writes bf16_attn_best.json; default: "
                        "DECODE_CONFIG's own)")
    p.add_argument("--prefill-p-parts-ab", action="store_true", help="prefill: also time p in 1 and 2 parts")
    p.add_argument("--prefill-flash-ab", action="store_true",
                   help="prefill: also time prompt-only rows through the Triton kernel, then torch's flash kernel")
    p.add_argument("--prefill-cudnn-ab", action="store_true",
                   help="prefill: also time equal-length prompt passes with torch's cuDNN attention off, on, off again")
    p.add_argument("--sweep-batches", default="1,16,64,128,200",
                   help="decode_sweep: the decode batches to profile, comma-separated")
    p.add_argument("--fp8-kernels", default="gemv,gemm,attention", help="fp8_kernels: which kernels to time")
    p.add_argument("--deadline-s", type=float, default=0,
                   help="sections that would start this many seconds after the script began are skipped (recorded as "
                        "such), so a bounded device call ends with its results saved (0: no deadline); so are offline's "
                        "seeds after the first. A section that starts in time runs to its end: leave the longest "
                        "section's time (engine build included) between the deadline and the call's limit")
    p.add_argument("--pytest-timeout", type=float, default=240, help="pytest: seconds before the run is stopped (0: no limit)")
    p.add_argument("--hf-compile", default="generate,loop", help="hf_compile approaches, tried in order until one runs")
    p.parse_args(namespace=OPTS)
    fp8_kernel_parts(OPTS.fp8_kernels)  # a misspelt part ends the run before any section
    if any(label.partition("@")[0] == "offline_decode_ab" for label in OPTS.sections.split(",")):
        try:  # so does a missing or bad --decode-entry file
            decode_entry(OPTS.decode_entry)
        except ValueError as e:
            p.error(str(e))
    SZ.update(SMOKE if OPTS.smoke else {})
    try:
        SZ.update(parse_sizes(OPTS.sizes))
    except ValueError as e:
        p.error(str(e))
    os.makedirs(OPTS.out, exist_ok=True)
    OPTS.bench_engine = None
    OPTS.bench_kw = dict(dtype="bfloat16", max_running_requests=OPTS.max_running, cuda_graph_max_bs=OPTS.graph_max_bs,
                         chunked_prefill_size=8192, max_prefill_tokens=16384)
    if OPTS.mem_fraction_static is not None:
        OPTS.bench_kw["mem_fraction_static"] = OPTS.mem_fraction_static
    OPTS.bench_variant = None
    OPTS.start = START
    for label in OPTS.sections.split(","):
        runs = sum(k.split("#")[0] == label and not k.endswith("_wall_s") for k in RESULTS)
        key = f"{label}#{runs}" if runs else label
        if past_deadline():
            RESULTS[key] = {"skipped": f"--deadline-s {OPTS.deadline_s:g} passed"}
            log(f"{key}: skipped, past the deadline")
            save()
            continue
        name, _, variant = label.partition("@")
        variant = variant or "bf16"
        uses_bench = name in NEEDS_BENCH_ENGINE
        if OPTS.bench_engine is not None and (not uses_bench or variant != OPTS.bench_variant):
            free(OPTS.bench_engine)  # its KV pool holds most of the GPU memory
            OPTS.bench_engine = None
        OPTS.variant_kw = VARIANTS[variant]
        if uses_bench and OPTS.bench_engine is None:
            free()  # earlier sections' memory back to the driver before the KV pool is sized
            OPTS.bench_engine = make_engine("llama3-8b", **{**OPTS.bench_kw, **OPTS.variant_kw})
            OPTS.bench_variant = variant
        OPTS.section_key = key
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
