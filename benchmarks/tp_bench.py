"""Tensor parallelism on GPUs: tp=N vs tp=1 (correctness, then speed). Needs N GPUs.

    python benchmarks/tp_bench.py --tp 2 --tokenizer .gpu_assets/tokenizer --out $OUT
    python benchmarks/tp_bench.py --tp 2 --variants replicated,leader,replicated+one-shot ...

Each section runs tp=1 once and tp=N once per variant (`--variants`, default `replicated`):
`replicated` / `leader` pick `--tp-scheduler`, `+one-shot` adds `--enable-one-shot-allreduce`.

1. logprobs   default model architecture (configs/smollm2-135m.json), bf16 dummy weights
              (identical at every tp: parallel layers shard the same draws), teacher-forced
              logprobs of tp=N vs tp=1 through benchmarks/logprob_check.py; passes if the
              max abs difference is within bf16 tolerance (--tol).
2. decode_bs1 Llama-3-8B shape (configs/llama3-8b.json), bf16 dummy weights: batch-1 decode
              tok/s, 128 prompt tokens, 256 generated, CUDA graphs on.
3. offline    the same model: 1000 requests, prompt U[32,1024], output U[32,512], ignore_eos
              (the workload of gpu_bench.py's offline section): output tok/s.

Every (section, tp) runs in a fresh child process (a clean GPU and process group); the
host's NCCL environment (e.g. NCCL_NVLS_ENABLE=0) passes through untouched. Results go
to OUT/tp_results.json; a table is printed last. --smoke runs the plumbing on CPU (gloo)
with a tiny config.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
CONFIGS = os.path.join(ROOT, "benchmarks", "configs")
VOCAB_FOR_PROMPTS = 49152  # random prompt ids stay below the smallest vocabulary
SIZES = dict(offline=1000, in_max=1024, out_max=512, bs1_in=128, bs1_out=256, shared=300, long=1500, new=16)
SMOKE = dict(offline=8, in_max=48, out_max=12, bs1_in=16, bs1_out=12, shared=24, long=80, new=4)
TINY = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=192, intermediate_size=256, num_hidden_layers=2,
    num_attention_heads=6, num_key_value_heads=3, head_dim=32, vocab_size=VOCAB_FOR_PROMPTS, max_position_embeddings=4096,
    rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
)  # fmt: skip


def config_path(name: str, smoke: bool) -> str:
    if smoke:
        path = "/tmp/radixflow-tp-smoke-config.json"
        with open(path, "w") as f:
            json.dump(TINY, f)
        return path
    return os.path.join(CONFIGS, f"{name}.json")


def variant_args(variant: str) -> dict:
    scheduler, _, extra = variant.partition("+")
    if scheduler not in ("replicated", "leader") or extra not in ("", "one-shot"):
        raise SystemExit(f"unknown variant {variant!r}: replicated or leader, optionally +one-shot")
    return {"tp_scheduler": scheduler, "enable_one_shot_allreduce": extra == "one-shot"}


def make_engine(opts, config: str, tp: int, **kw):
    import radixflow

    if tp > 1:
        kw.update(variant_args(opts.child_variant))
    kw.update(tp_size=tp, load_format="dummy", max_total_tokens=kw.get("max_total_tokens", 200_000))
    if opts.tokenizer:
        kw["tokenizer_path"] = opts.tokenizer
    if opts.attention_backend:
        kw["attention_backend"] = opts.attention_backend
    if opts.smoke:
        kw.update(device="cpu", dtype="float32", max_total_tokens=8192)
    else:
        kw.setdefault("dtype", "bfloat16")
    if opts.graph_max_bs is not None:
        kw["cuda_graph_max_bs"] = opts.graph_max_bs
    if os.environ.get("RADIXFLOW_TP_BENCH_NO_GRAPH"):
        kw["disable_cuda_graph"] = True
    return radixflow.Engine(config_path(config, opts.smoke), **kw)


def greedy(n: int) -> dict:
    return {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}


def rand_ids(rng: random.Random, n: int) -> list:
    return [rng.randrange(3, VOCAB_FOR_PROMPTS) for _ in range(n)]


# -- sections (each runs in a child process for one tp size) -------------------------------------
def sec_logprobs(opts, tp: int, sz: dict) -> dict:
    """Candidate logprobs at this tp; the parent compares them against tp=1's."""
    from logprob_check import make_prompts, run_candidate

    eng = make_engine(opts, "smollm2-135m", tp, chunked_prefill_size=512 if not opts.smoke else 32)
    try:
        warm, batch, starts = make_prompts(VOCAB_FOR_PROMPTS, sz["shared"], sz["long"])
        run = run_candidate(eng, warm, batch, starts, sz["new"])
        return {"input_lps": run.input_lps, "output_lps": run.output_lps, "output_ids": run.output_ids}
    finally:
        eng.shutdown()


def _decode_rate(eng, prompt: list, n: int) -> float:
    def run(k: int) -> float:
        t = time.perf_counter()
        eng.generate(input_ids=[prompt], sampling_params=greedy(k))
        return time.perf_counter() - t

    run(8)
    t1 = min(run(1) for _ in range(3))
    tn = min(run(n) for _ in range(2))
    return (n - 1) / (tn - t1)


def sec_decode_bs1(opts, tp: int, sz: dict) -> dict:
    eng = make_engine(opts, "llama3-8b", tp)
    try:
        prompt = rand_ids(random.Random(7), sz["bs1_in"])
        return {"tok_s": _decode_rate(eng, prompt, sz["bs1_out"])}
    finally:
        eng.shutdown()


def sec_offline(opts, tp: int, sz: dict) -> dict:
    eng = make_engine(opts, "llama3-8b", tp)
    try:
        rng = random.Random(2024)
        reqs = [(rand_ids(rng, rng.randint(32, sz["in_max"])), rng.randint(2, sz["out_max"])) for _ in range(sz["offline"])]
        eng.generate(input_ids=[reqs[0][0]], sampling_params=greedy(4))  # warm-up
        eng.flush_cache()
        t = time.perf_counter()
        res = eng.generate(input_ids=[p for p, _ in reqs], sampling_params=[greedy(o) for _, o in reqs])
        dt = time.perf_counter() - t
        out = sum(r["meta_info"]["completion_tokens"] for r in res)
        return {"s": dt, "out_tok_s": out / dt, "total_tok_s": (out + sum(len(p) for p, _ in reqs)) / dt}
    finally:
        eng.shutdown()


SECTIONS = {"logprobs": sec_logprobs, "decode_bs1": sec_decode_bs1, "offline": sec_offline}


def child(opts) -> None:
    sz = SMOKE if opts.smoke else SIZES
    result = SECTIONS[opts.child](opts, opts.child_tp, sz)
    with open(opts.child_out, "w") as f:
        json.dump(result, f)


# -- parent: run the children, compare, print the table --------------------------------------------
def run_child(opts, section: str, tp: int, variant: str = "replicated") -> dict:
    path = os.path.join(opts.out, f"{section}_{label(tp, variant)}.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", section, "--child-tp", str(tp), "--child-out", path,
           "--out", opts.out, "--child-variant", variant] + (["--tokenizer", opts.tokenizer] if opts.tokenizer else []) + (["--smoke"] if opts.smoke else []) \
        + (["--attention-backend", opts.attention_backend] if opts.attention_backend else []) \
        + (["--graph-max-bs", str(opts.graph_max_bs)] if opts.graph_max_bs is not None else [])
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, start_new_session=True)  # own group: a timeout kills its rank processes too
    try:
        code = proc.wait(timeout=opts.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return {"error": f"timed out after {opts.timeout}s"}
    if code != 0:
        return {"error": f"exit {code}"}
    with open(path) as f:
        out = json.load(f)
    out["wall_s"] = time.perf_counter() - t
    return out


def compare_logprobs(ref: dict, cand: dict, tol: float) -> dict:
    from logprob_check import max_abs_diff

    same_ids = ref["output_ids"] == cand["output_ids"]
    pre = max_abs_diff(ref["input_lps"], cand["input_lps"])
    # decode logprobs are comparable position by position only while the tokens agree
    dec = max_abs_diff(ref["output_lps"], cand["output_lps"]) if same_ids else None
    worst = max(pre, dec or 0.0)
    return {"prefill_max_abs": pre, "decode_max_abs": dec, "same_greedy_ids": same_ids, "pass": worst <= tol}


def logprob_verdict(ref: dict, cand: dict, tol: float) -> dict:
    for name, r in (("tp=1", ref), ("candidate", cand)):
        if "error" in r:
            return {"error": f"{name} run failed: {r['error']}"}
    return compare_logprobs(ref, cand, tol)


def label(tp: int, variant: str) -> str:
    return "tp1" if tp == 1 else f"tp{tp}-{variant}"


def print_table(results: dict, tp: int, variants: list) -> None:
    rows = [("section", "tp=1", f"tp={tp} variant", f"tp={tp}", "note")]
    for v in variants:
        lp = results.get("logprobs", {}).get(label(tp, v))
        if lp and "pass" in lp:
            dec = lp.get("decode_max_abs")
            rows.append(("logprobs max |diff|", "-", v, f"{lp['prefill_max_abs']:.4f} / {dec if dec is None else round(dec, 4)}",
                         f"prefill / decode; pass={lp['pass']} same ids={lp['same_greedy_ids']}"))
        elif lp:
            rows.append(("logprobs max |diff|", "-", v, "err", str(lp.get("error", ""))))
    for key, name, metric in (("decode_bs1", "8B bs1 decode tok/s", "tok_s"), ("offline", "8B offline out tok/s", "out_tok_s")):
        r = results.get(key, {})
        for v in variants if r else []:
            a, b = r.get("tp1", {}).get(metric), r.get(label(tp, v), {}).get(metric)
            rows.append((name, f"{a:.1f}" if a else "err", v, f"{b:.1f}" if b else "err", f"x{b / a:.2f}" if a and b else ""))
    widths = [max(len(str(r[i])) for r in rows) for i in range(5)]
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--sections", default="logprobs,decode_bs1,offline")
    ap.add_argument("--tokenizer", default=None, help="tokenizer dir for dummy-weight models (default: the default model's)")
    ap.add_argument("--out", default="/tmp/tp_bench")
    ap.add_argument("--attention-backend", default=None, help="triton, torch_native or flashinfer (default: the engine's)")
    ap.add_argument("--tol", type=float, default=0.1, help="bf16 logprob tolerance (max abs)")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--graph-max-bs", type=int, default=None, help="largest decode batch with a CUDA graph (engine default: max_running_requests)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--child", default=None)
    ap.add_argument("--child-tp", type=int, default=1)
    ap.add_argument("--child-out", default=None)
    ap.add_argument("--child-variant", default="replicated")
    ap.add_argument("--variants", default="replicated", help="tp>1 variants, comma-separated: replicated, leader, "
                    "each optionally +one-shot (e.g. replicated+one-shot)")
    opts = ap.parse_args()
    os.makedirs(opts.out, exist_ok=True)
    if opts.child:
        child(opts)
        return
    variants = opts.variants.split(",")
    for v in variants:
        variant_args(v)  # fail before anything runs
    results: dict = {}
    for section in opts.sections.split(","):
        runs = {"tp1": run_child(opts, section, 1)}
        runs.update({label(opts.tp, v): run_child(opts, section, opts.tp, v) for v in variants})
        if section == "logprobs":
            results[section] = {k: logprob_verdict(runs["tp1"], r, opts.tol) for k, r in runs.items() if k != "tp1"}
        else:
            results[section] = {k: {m: v for m, v in r.items() if not m.endswith("_lps")} for k, r in runs.items()}
        with open(os.path.join(opts.out, "tp_results.json"), "w") as f:
            json.dump(results, f, indent=1)
    print_table(results, opts.tp, variants)


if __name__ == "__main__":
    main()
