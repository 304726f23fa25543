"""Admission rules against a tight KV pool, on the CPU: retractions, decode steps, mean decode batch,
recomputed prompt tokens, under `--admission-rule peak` (the default) and `ratio` (SGLang's).

A scheduler-level simulation: the tiny model (benchmarks/configs/smollm2-tiny.json, dummy weights), random
prompt ids, every workload submitted at once as gpu_bench.py's offline sections do, a KV pool sized to
hold --pool-fraction of the workload's prompt + output tokens. Workloads (--workloads):

  1k1k     --n requests of --len prompt tokens and --len output tokens, ignore_eos (gpu_bench's offline_1k scaled)
  offline  in U[32,1024] / --scale, out U[32,512] / --scale, ignore_eos (gpu_bench's offline scaled)
  stops    in U[32,1024] / --scale, a budget of 1024 / --scale, no ignore_eos: temperature-1 sampling stops at
           any of --stop-ids random token ids (1% of the vocabulary by default: most requests stop early),
           where the observed stop ratio matters
  bimodal  as stops, but half the requests stop at any of 10% of the vocabulary (a few tokens) and half only at
           one id (run to their budget, in practice): the short ones finish first, so the observed ratio starts low

Recomputed tokens: prompt + output tokens prefilled beyond each request's prompt (a retracted request
whose KV was evicted computes it again). Wall time and output tok/s are the CPU's (noisy on a shared
machine); the step counts and batch sizes are what carries over to a GPU.

    python benchmarks/admission_cpu.py --workloads 1k1k,offline,stops --n 200 --len 100 --pool-fraction 0.33
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CONFIG = os.path.join(ROOT, "benchmarks", "configs", "smollm2-tiny.json")
VOCAB = 49152


def workload(name: str, a: argparse.Namespace, seed: int) -> tuple[list, list]:
    rng = random.Random(seed)
    ids = lambda n: [rng.randrange(100, VOCAB) for _ in range(n)]  # noqa: E731
    if name == "1k1k":
        return [ids(a.len) for _ in range(a.n)], [dict(max_new_tokens=a.len, ignore_eos=True, temperature=0.0)] * a.n
    prompts = [ids(rng.randint(max(32 // a.scale, 2), 1024 // a.scale)) for _ in range(a.n)]
    if name == "offline":
        params = [dict(max_new_tokens=rng.randint(max(32 // a.scale, 2), 512 // a.scale), ignore_eos=True, temperature=0.0)
                  for _ in range(a.n)]  # fmt: skip
        return prompts, params
    assert name in ("stops", "bimodal"), name
    many = sorted(random.Random(seed + 1).sample(range(100, VOCAB), a.stop_ids if name == "stops" else VOCAB // 10))
    stop_ids = [many if name == "stops" or i % 2 else many[:1] for i in range(a.n)]
    return prompts, [dict(max_new_tokens=1024 // a.scale, stop_token_ids=stop_ids[i], temperature=1.0, sampling_seed=i)
                     for i in range(a.n)]  # fmt: skip


def pool_tokens(prompts: list, params: list, fraction: float) -> int:
    return int(fraction * sum(len(p) + s["max_new_tokens"] for p, s in zip(prompts, params)))


def count_passes(runner) -> list:
    """(mode, batch) of every forward pass, by wrapping runner.forward."""
    passes, real = [], runner.forward

    def counted(fb):
        passes.append((fb.mode.value, fb.batch_size))
        return real(fb)

    runner.forward = counted
    return passes


def run(name: str, rule: str, a: argparse.Namespace, seed: int) -> dict:
    import radixflow
    from radixflow.model_files import resolve_model

    prompts, params = workload(name, a, seed)
    pool = pool_tokens(prompts, params, a.pool_fraction)
    eng = radixflow.Engine(CONFIG, load_format="dummy", tokenizer_path=a.tokenizer or resolve_model(None).path,
                           device="cpu", dtype="float32", max_total_tokens=pool, admission_rule=rule,
                           chunked_prefill_size=a.chunk, max_running_requests=a.max_running, random_seed=seed)  # fmt: skip
    try:
        passes = count_passes(eng.runner)
        t = time.perf_counter()
        res = eng.generate(input_ids=prompts, sampling_params=params)
        dt = time.perf_counter() - t
        st = eng.scheduler.stats
    finally:
        eng.shutdown()
    out = sum(r["meta_info"]["completion_tokens"] for r in res)
    decode = [b for m, b in passes if m == "decode"]
    return {"workload": name, "rule": rule, "seed": seed, "pool": pool, "out_tokens": out,
            "retractions": st.retractions, "recomputed": st.extend_tokens - sum(map(len, prompts)),
            "decode_steps": len(decode), "extend_steps": len(passes) - len(decode),
            "mean_decode_bs": round(sum(decode) / max(len(decode), 1), 1), "max_decode_bs": max(decode, default=0),
            "used_budget": round(out / sum(s["max_new_tokens"] for s in params), 3),
            "s": round(dt, 2), "out_tok_s": round(out / dt, 1)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="1k1k,offline,stops", help="comma-separated: 1k1k, offline, stops, bimodal")
    ap.add_argument("--rules", default="ratio,peak", help="--admission-rule values to run, in this order")
    ap.add_argument("--n", type=int, default=200, help="requests per workload")
    ap.add_argument("--len", type=int, default=100, help="1k1k: prompt and output tokens of every request")
    ap.add_argument("--scale", type=int, default=8, help="offline / stops: the GPU workload's lengths divided by this")
    ap.add_argument("--pool-fraction", type=float, default=0.33,
                    help="KV pool size as a fraction of the workload's prompt + output tokens")
    ap.add_argument("--chunk", type=int, default=512, help="--chunked-prefill-size of the engine")
    ap.add_argument("--max-running", type=int, default=1024, help="--max-running-requests of the engine")
    ap.add_argument("--stop-ids", type=int, default=VOCAB // 100, help="stops: how many random token ids stop a request")
    ap.add_argument("--seeds", default="0", help="comma-separated workload seeds")
    ap.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the default model's)")
    ap.add_argument("--out", default="", help="also write the rows to this JSON file")
    a = ap.parse_args()
    rows = []
    for seed in (int(s) for s in a.seeds.split(",")):
        for name in a.workloads.split(","):
            for rule in a.rules.split(","):
                rows.append(run(name, rule, a, seed))
                print(json.dumps(rows[-1]), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
