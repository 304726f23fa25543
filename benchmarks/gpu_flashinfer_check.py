"""The FlashInfer attention backend on the GPU machine, in one run (installs nothing):

    pip install -q --no-deps --target /tmp/site .whl_flashinfer/*.whl
    PYTHONPATH=/tmp/site python3 benchmarks/gpu_flashinfer_check.py --out $OUT/fi

Sections, in order; each is isolated (a failure is recorded, the next one runs), and one
that would end past --deadline-s is skipped:
  env      versions, GPU, nvcc
  jit      FlashInfer's JIT build, sm_90a only, of the modules the GPU cases need, in one ninja
           run over MAX_JOBS cores: the prefill kernel (extend, and decode on tensor cores) for
           bf16 / head_dim 128, fp16 / 128 and bf16 / 64, the CUDA-core decode kernel for bf16 /
           128 and bf16 / 64; then one backend a shape (a slow one built what was missed); if it
           fails, the compiler's output tail is recorded and the script stops, exit status 0
  correct  FlashInferBackend vs torch-native (float32), the GPU tests' cases at one layer each:
           a mixed extend batch (fresh requests and prefix hits) and decode, at Llama-3-8B heads
           (32 q / 8 kv / 128: tensor cores; 16 kv: CUDA cores) in bf16 and fp16 and at
           SmolLM2-135M heads (9 q / 3 kv / 64: CUDA cores) in bf16; decode CUDA graphs replayed
           after re-planning, at both models' heads
  attn     decode attention per layer, 32 layers replayed in a CUDA graph (KV beyond the L2
           cache, slots randomly permuted): FlashInfer on tensor cores and on CUDA cores vs the
           Triton kernel, at 1 x 4096, 64 x 400 and 200 x 700 tokens; plus the host time of
           one plan (once per step)
  e2e      batch-1 decode tok/s of the Engine (Llama-3-8B config, dummy weights, bf16, CUDA
           graphs), attention_backend triton vs flashinfer, and how many greedy tokens agree
  e2e_smollm2  the same for the SmolLM2-135M config
  pytest   (not by default) tests/test_flashinfer_backend.py -m gpu in a subprocess
The JIT cache goes to .flashinfer_cache/ (git-ignored; kept between calls on a warm machine).
Results: OUT/flashinfer_check.json, rewritten after every section.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# before flashinfer is imported: it reads these at import time
os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0")  # -> sm_90a only
os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 16))  # ninja's parallelism
os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", os.path.join(ROOT, ".flashinfer_cache"))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import test_flashinfer_backend as T  # noqa: E402  (its GPU helpers: batches, pools, the reference)
import torch  # noqa: E402

HQ, HKV, D, DT = 32, 8, 128, torch.bfloat16
LAYERS = 32
ATTN_CASES = {"1x4096": (1, 4096), "64x400": (64, 400), "200x700": (200, 700)}
COST_S = dict(env=10, jit=240, correct=35, attn=45, e2e=120, e2e_smollm2=60, pytest=90)  # rough, for the deadline
RESULTS: dict = {}
OPTS = argparse.Namespace()
T0 = time.perf_counter()


def save() -> None:
    with open(os.path.join(OPTS.out, "flashinfer_check.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def tail(text: str, n: int = 4000) -> str:
    return text[-n:]


# -- sections -------------------------------------------------------------------------------------
def section_env() -> dict:
    import triton

    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
           "gpu": torch.cuda.get_device_name(), "cpus": os.cpu_count(),
           "env": {k: os.environ[k] for k in ("FLASHINFER_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS",
                                              "FLASHINFER_WORKSPACE_BASE")}}  # fmt: skip
    try:
        nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
        out["nvcc"] = nvcc.strip().splitlines()[-2:]
    except OSError as e:
        out["nvcc"] = repr(e)
    try:
        import flashinfer
    except ImportError as e:  # recorded here; the jit section then fails on it and stops the run
        out["flashinfer"] = f"does not import: {e!r}"
    else:
        out["flashinfer"] = f"{flashinfer.__version__} at {os.path.dirname(flashinfer.__file__)}"
    return out


def section_jit() -> dict:
    """All modules in one ninja run (flashinfer 0.3's JIT API), then a backend a shape, which
    loads them (or builds what is missing, one module at a time) and runs its warm-up passes."""
    out = {}
    t = time.perf_counter()
    try:
        try:
            from flashinfer.jit import build_jit_specs
        except ImportError as e:
            out["prebuild"] = f"skipped: {e!r}"
        else:
            specs = jit_specs()
            build_jit_specs(specs, verbose=False)
            out["modules"] = [s.name for s in specs]
        out["compile_s"] = round(time.perf_counter() - t, 1)
        out["backend_init_s"] = {}
        for heads in dict.fromkeys(h for *_, h in T.GPU_CASES.values()):
            t = time.perf_counter()
            kw = T._kwargs(dtype=heads.dtype, device="cuda", heads=(heads.hq, heads.hkv, heads.d), slots=16, layers=1)
            make_backend(kw)
            out["backend_init_s"][str(heads)] = round(time.perf_counter() - t, 1)
    except Exception as e:
        RESULTS["jit_error_tail"] = tail(str(e), 8000)
        raise
    return out


def jit_specs() -> list:
    """The modules the backend loads for the GPU cases' shapes: FlashInfer's prefill kernel
    (extend, and decode on tensor cores) for each (dtype, head_dim), and its CUDA-core decode
    kernel where a case decodes on CUDA cores. The arguments are those the wrappers' plan()
    passes (index dtype int32, no rope / sliding window / soft cap / fp16 QK reduction), so the
    module names match and the backend loads these builds."""
    from flashinfer.jit import gen_batch_decode_module, gen_batch_prefill_module

    need: dict[tuple, None] = {}
    for *_, h in T.GPU_CASES.values():
        need[("prefill", h.dtype, h.d)] = None
        if not h.tensor_cores:
            need[("decode", h.dtype, h.d)] = None
    specs = []
    for kind, dt, d in need:
        args = (dt, dt, dt, torch.int32, d, d, 0, False, False)  # dtypes q/kv/out/index, head dims, no extras
        prefill = kind == "prefill"
        specs.append(gen_batch_prefill_module("fa2", *args, False) if prefill else gen_batch_decode_module(*args))
    return specs


def section_correct() -> dict:
    """Max abs error vs torch-native in float32 (the GPU tests' cases, one layer each), and the
    GPU tests' CUDA-graph check."""
    out = {}
    for name, (prefix, extend, heads) in T.GPU_CASES.items():
        try:
            err, tensor_cores = T.attention_error(prefix, extend, heads, layers=1)
            ok = err <= heads.tol and tensor_cores == heads.tensor_cores
            out[name] = {"heads": str(heads), "max_abs_err": err, "tol": heads.tol, "tensor_cores": tensor_cores,
                         "ok": ok}  # fmt: skip
        except Exception:
            out[name] = {"heads": str(heads), "ok": False, "error": tail(traceback.format_exc(), 2000)}
    for shape, heads in T.GRAPH_HEADS.items():  # capture at batch 4, replay re-planned for other lengths and batch 3
        key = f"cuda_graph_replay_{shape}"
        try:
            T.test_gpu_cuda_graph_replans_for_each_replay(shape)
            out[key] = {"heads": str(heads), "ok": True}
        except Exception:
            out[key] = {"heads": str(heads), "ok": False, "error": tail(traceback.format_exc(), 2000)}
    return out


def make_pool(lens: list[int], layers: int = LAYERS):
    """KV pool + req_to_token for one batch: request b in row b + 1, slots a random permutation."""
    from radixflow.radix_cache.memory_pool import KVPool, ReqToTokenPool

    total = sum(lens)
    pool = KVPool(total + 16, 1, layers, HKV, D, DT, "cuda")
    for buf in pool.k + pool.v:
        buf.normal_()
    table = ReqToTokenPool(len(lens) + 1, max(lens) + 8, "cuda")
    perm = (torch.randperm(total, device="cuda") + 1).int()
    used = torch.arange(table.table.shape[1], device="cuda")[None, :] < torch.tensor(lens, device="cuda")[:, None]
    table.table[1:][used] = perm
    return dict(kv_pool=pool, req_to_token=table, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D)


def make_backend(kw: dict, name: str = "flashinfer", **extra):
    from radixflow.runtime.execution.attention.flashinfer_backend import FlashInferBackend
    from radixflow.runtime.execution.attention.triton_backend import TritonBackend

    return TritonBackend(**kw) if name == "triton" else FlashInferBackend(**kw, **extra)


def section_attn() -> dict:
    out = {}
    for case, (bs, n) in ATTN_CASES.items():
        lens = [n] * bs
        kw = make_pool(lens)
        fb = T._batch(kw["req_to_token"].table, [n - 1] * bs, [1] * bs)
        q = torch.randn(bs, HQ, D, device="cuda", dtype=DT)
        kv_bytes = sum(lens) * HKV * D * DT.itemsize * 2
        res, outs = {}, {}
        variants = {"triton": ("triton", {}), "flashinfer_tc": ("flashinfer", {"decode_tensor_cores": True}),
                    "flashinfer_cuda_cores": ("flashinfer", {"decode_tensor_cores": False})}  # fmt: skip
        for label, (name, extra) in variants.items():
            try:
                outs[label], res[label] = time_decode(make_backend(kw, name, **extra), q, fb)
                res[label]["tb_s"] = round(kv_bytes / res[label]["us_per_layer"] / 1e6, 3)
            except Exception as e:
                res[label] = {"failed": tail(repr(e), 1500)}
        for label, o in outs.items():
            if label != "triton" and "triton" in outs:
                res[label]["max_abs_diff_vs_triton"] = (o - outs["triton"]).abs().max().item()
        out[case] = res
        log(f"attn {case}: " + ", ".join(f"{k} {v.get('us_per_layer', 'failed')} us" for k, v in res.items()))
        del kw, fb
        torch.cuda.empty_cache()
    return out


def time_decode(backend, q: torch.Tensor, fb) -> tuple[torch.Tensor, dict]:
    """One decode step's attention: the output at layer 0, the GPU time per layer (all layers
    replayed in one CUDA graph, planned once before) and the host time of one plan."""
    from radixflow.kernels.gemv import time_graph_us

    plan_us = host_us(lambda: backend.init_forward_metadata(fb))
    out = backend._attend(q, None, None, 0, fb).float()
    us = time_graph_us(lambda i: backend._attend(q, None, None, i % LAYERS, fb), LAYERS)
    return out, {"us_per_layer": round(us, 2), "plan_host_us": round(plan_us, 1)}


def host_us(fn, reps: int = 20) -> float:
    """Median host time of fn() (the GPU idle before each call)."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2] * 1e6


def section_pytest() -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/test_flashinfer_backend.py"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = p.stdout.strip().splitlines()
    return {"returncode": p.returncode, "summary": lines[-1:], "tail": tail(p.stdout + p.stderr, 3000)}


def section_e2e() -> dict:
    return compare_backends("llama3-8b")


def section_e2e_smollm2() -> dict:
    return compare_backends("smollm2-135m")


def compare_backends(config: str) -> dict:
    out = {}
    prompt = random.Random(0).choices(range(100, 40000), k=128)  # below SmolLM2's vocabulary (49152)
    for name in ("triton", "flashinfer"):
        try:
            out[name] = engine_decode(config, name, prompt)
        except Exception:
            out[name] = {"failed": tail(traceback.format_exc(), 3000)}
        log(f"e2e {config} {name}: {out[name]}")
    ids = [out[n].get("greedy_ids") for n in ("triton", "flashinfer")]
    if all(ids):  # random weights: near-tied logits may still part the two after a few tokens
        out["greedy_ids_agree_for"] = next((i for i, (a, b) in enumerate(zip(*ids)) if a != b), len(ids[0]))
    return out


def engine_decode(config: str, backend: str, prompt: list[int]) -> dict:
    import gc

    import radixflow

    t = time.perf_counter()
    eng = radixflow.Engine(
        os.path.join(ROOT, "benchmarks", "configs", f"{config}.json"), load_format="dummy", dtype="bfloat16",
        tokenizer_path=OPTS.tokenizer, attention_backend=backend, cuda_graph_max_bs=1, max_running_requests=4,
        max_total_tokens=32768, context_length=4096,
    )  # fmt: skip
    try:
        r = {"init_s": round(time.perf_counter() - t, 1), "cuda_graphs": eng.runner.graph_runner is not None,
             "decode_tensor_cores": getattr(eng.runner.backend, "tensor_cores", None)}  # fmt: skip
        r["tok_s"] = round(decode_rate(eng, prompt, OPTS.e2e_tokens), 1)
        r["greedy_ids"] = eng.generate(input_ids=prompt, sampling_params=greedy(16))["output_ids"]
        return r
    finally:
        eng.shutdown()
        del eng
        gc.collect()
        torch.cuda.empty_cache()


def greedy(n: int) -> dict:
    return {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}


def decode_rate(eng, prompt: list, n: int) -> float:
    """Decode tokens/s of one request: (n - 1) / (time(n tokens) - time(1 token))."""

    def run(k: int) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        eng.generate(input_ids=prompt, sampling_params=greedy(k))
        torch.cuda.synchronize()
        return time.perf_counter() - t

    run(8)
    t1 = min(run(1) for _ in range(3))
    tn = min(run(n) for _ in range(2))
    return (n - 1) / (tn - t1)


SECTIONS = {"env": section_env, "jit": section_jit, "correct": section_correct, "attn": section_attn,
            "e2e": section_e2e, "e2e_smollm2": section_e2e_smollm2, "pytest": section_pytest}  # fmt: skip
DEFAULT_SECTIONS = "env,jit,correct,attn,e2e,e2e_smollm2"  # pytest repeats `correct` (+ GPU tests at 2 layers)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--sections", default=DEFAULT_SECTIONS, help=f"of {','.join(SECTIONS)}")
    p.add_argument("--deadline-s", type=float, default=340, help="skip a section that would end after this")
    p.add_argument("--tokenizer", default=os.path.join(ROOT, ".gpu_assets", "tokenizer"))
    p.add_argument("--e2e-tokens", type=int, default=256)
    p.parse_args(namespace=OPTS)
    os.makedirs(OPTS.out, exist_ok=True)
    for name in OPTS.sections.split(","):
        elapsed = time.perf_counter() - T0
        if elapsed + COST_S[name] > OPTS.deadline_s:
            RESULTS[name] = {"skipped": f"deadline: {elapsed:.0f}s elapsed, ~{COST_S[name]}s needed"}
            log(f"skip {name}")
            continue
        log(f"section {name}")
        t = time.perf_counter()
        try:
            RESULTS[name] = section = SECTIONS[name]()
            section["section_s"] = round(time.perf_counter() - t, 1)
        except Exception as e:
            RESULTS[name] = {"failed": repr(e)[:500], "traceback": tail(traceback.format_exc())}
            log(f"{name} failed: {e!r}"[:2000])
            if name in ("env", "jit"):  # nothing after this can run
                save()
                break
        save()
    print(json.dumps(RESULTS, indent=1, default=str)[-6000:])


if __name__ == "__main__":
    main()
