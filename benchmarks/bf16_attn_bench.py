"""Decode attention over a bf16 pool at the offline workload's shapes: launch variants against DECODE_CONFIG (one GPU):

    python3 benchmarks/bf16_attn_bench.py --out $OUT/bf16attn [--cases 544xU,512x660] [--variants REGEX]

Cases: Llama-3-8B heads (32 q / 8 KV of 128), batch 256-768 at the contexts of gpu_bench's `offline` pass
(1,000 requests, prompts U[32,1024], outputs U[32,512]: mean batch ~544, mean context ~660 over its decode steps):
lengths drawn uniformly per case (seeded) or fixed, KV slots a random permutation of the pool's
(gpu_attn_bench.make_inputs: a pool after churn, one token per page as the engine's default page size).

`default` is DECODE_CONFIG as it stands (its `bf16` entry included where its gates pass); every other label a
whole launch of the bf16 pool (block_n / num_warps / num_stages, `_wv` waves, i.e. split count;
gpu_attn_bench._name); each run records the launch it resolved to (`launch`). Each variant is checked against the
float32 reference (max abs error > 2e-2 fails loudly: listed, not timed, exit 1) and its largest difference from
the default's output is recorded (`vs_default`: every launch rounds to the same bf16 outputs, so the error
against the reference hardly tells launches apart), captured per layer call in
a CUDA graph, and the graphs of a case are replayed in --rounds interleaved rounds (forward, then reverse
order) so a drift of the machine falls on every variant alike: the median round is the figure (us, TB/s of
K+V read). Kernels are compiled first in --jobs processes. Stage 1's shared memory and registers per program
are read from Triton's compiled kernel where its API allows.

Writes DIR/bf16_attn_bench.json and DIR/bf16_attn_best.json: the variant with the lowest geometric mean time
over the cases from --min-batch up, with its ratio to `default` and, when it is not DECODE_CONFIG's top-level
launch, a `bf16` entry for DECODE_CONFIG (its launch keys, gated on what was timed: min_batch, the head size, the
KV head count and this GPU's compute capability major) that gpu_bench.py --decode-entry times against no entry
in its `offline_decode_ab` section (null: the top-level launch won).
"""

from __future__ import annotations

import json
import math
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gpu_attn_bench as attn  # noqa: E402
from radixflow.kernels import decode_attention as da  # noqa: E402
from radixflow.kernels import reference as ref  # noqa: E402
from radixflow.kernels.gemv import capture_graph, replay_us  # noqa: E402

# name: (batch, lengths: int, or (low, high) drawn uniformly)
CASES = {"768xU": (768, (32, 1024)), "544xU": (544, (64, 1280)), "512x660": (512, 660), "384xU": (384, (200, 1400)),
         "256xU": (256, (300, 1500)),
         # decode batches of the program suite's graph mode (benchmarks/programs/mixed_pass_probe.py: 40-200 rows)
         "16x516": (16, 516), "64x516": (64, 516), "128x516": (128, 516), "200x516": (200, 516),
         "64xU": (64, (200, 1500)), "128xU": (128, (100, 1200))}
MID_CASES = "16x516,64x516,128x516,200x516,64xU,128xU"
# (block_n, num_warps, num_stages, other keys) over gpu_attn_bench.BASE (DECODE_CONFIG's large-batch launch)
SWEEP = [
    (64, 4, 3, {}), (64, 4, 2, {}), (64, 4, 4, {}), (64, 4, 5, {}), (64, 8, 3, {}), (64, 8, 4, {}), (64, 2, 3, {}),
    (32, 4, 3, {}), (32, 4, 4, {}), (32, 4, 5, {}), (32, 4, 6, {}), (32, 2, 4, {}), (32, 2, 6, {}),
    (128, 4, 2, {}), (128, 4, 3, {}), (128, 8, 2, {}), (128, 8, 3, {}),
    (64, 4, 3, {"waves": 16}), (64, 4, 4, {"waves": 16}), (32, 4, 4, {"waves": 16}), (64, 4, 3, {"waves": 32}),
    # more splits for the mid-sized batches (MID_CASES)
    (64, 4, 3, {"waves": 8}), (64, 2, 3, {"waves": 8}), (64, 2, 3, {"waves": 16}), (64, 2, 4, {"waves": 8}),
    (32, 2, 4, {"waves": 8}), (32, 4, 4, {"waves": 8}), (128, 4, 3, {"waves": 8}), (32, 2, 4, {"waves": 16}),
]
ENTRY_KEYS = ("block_n", "num_warps", "num_stages", "waves")  # what a swept variant may change, hence the entry's keys


def case_lengths(name: str) -> list[int]:
    bs, lens = CASES[name]
    if isinstance(lens, int):
        return [lens] * bs
    rng = random.Random(name)
    return [rng.randint(*lens) for _ in range(bs)]


def sweep_configs() -> dict[str, dict]:
    return {attn._name(c): c for c in map(attn._variant, SWEEP)}


def variants(pattern: str) -> list[tuple[str, dict | None]]:
    """(label, config; None: DECODE_CONFIG) to time: `default`, then the swept launches matching `pattern`."""
    import re

    return [("default", None)] + [(lab, cfg) for lab, cfg in sweep_configs().items() if re.search(pattern, lab)]


def _splits(bs: int, cfg: dict | None, sms: int) -> int:
    return da.num_kv_splits(bs, attn.KV_HEADS, sms, config=cfg, pool="bf16", head_dim=attn.HEAD_DIM)


def precompile(names: list[str], pattern: str, sms: int, jobs: int) -> None:
    tasks = {}
    for name in names:
        bs = CASES[name][0]
        for _, cfg in variants(pattern):
            tasks[json.dumps([cfg, _splits(bs, cfg, sms)])] = (cfg, _splits(bs, cfg, sms), True, False)
    attn.compile_in_processes(list(tasks.values()), jobs)


def _compiled() -> dict:
    """Stage 1's compiled kernels in this process by cache key (empty where Triton's internals differ)."""
    try:
        return {key: k for cache in da._decode_stage1.device_caches.values() for key, k in cache[0].items()}
    except Exception:
        return {}


def _kernel_stats(before: dict) -> dict:
    """Shared memory, registers and spills of the stage-1 kernels compiled since `before` (the largest)."""
    new = [k for key, k in _compiled().items() if key not in before]
    stats = {}
    for k in new:
        try:
            stats["shared"] = max(stats.get("shared", 0), int(k.metadata.shared))
            stats["regs"] = max(stats.get("regs", 0), int(k.n_regs))
            stats["spills"] = max(stats.get("spills", 0), int(k.n_spills))
        except Exception:
            pass
    return stats


def bench_case(name: str, pattern: str, sms: int, rounds: int = 3) -> dict:
    lens = case_lengths(name)
    bs, x = len(lens), attn.make_inputs(lens)
    args = (x["q"], x["k"], x["v"], x["table"])
    want = ref.decode_attention_ref(x["q"].float(), *args[1:], x["idx"][0], x["lens"], attn.SCALE)
    nbytes = attn.kv_bytes(lens)
    res = {"batch": bs, "mean_len": sum(lens) / bs, "kv_mb": nbytes / 1e6, "copies": x["copies"], "runs": {}}
    graphs, calls, default_out = {}, max(x["copies"], 4), None
    for label, cfg in variants(pattern):
        splits = _splits(bs, cfg, sms)

        def run(i: int, cfg=cfg, splits=splits):
            return da.decode_attention(*args, x["idx"][i % x["copies"]], x["lens"], attn.SCALE, splits, config=cfg)

        r = res["runs"][label] = {"splits": splits, "launch": attn.launch_label(bs, cfg)}
        try:
            before = _compiled()
            got = run(0).float()
            default_out = got if default_out is None else default_out  # `default` runs first
            r["err"], r["vs_default"] = (got - want).abs().max().item(), (got - default_out).abs().max().item()
            r.update(_kernel_stats(before))
            if not r["err"] <= attn.TOL:
                print(f"FAIL {name} {label}: max abs error {r['err']:.4f} > {attn.TOL}", flush=True)
                continue
            graphs[label] = capture_graph(run, calls)
        except Exception as e:  # a config the compiler or the GPU rejects (shared memory): report it, keep sweeping
            r["failed"] = repr(e)[:300]
    order = list(graphs)
    for rnd in range(rounds):
        for label in order if rnd % 2 == 0 else order[::-1]:
            res["runs"][label].setdefault("rounds_us", []).append(replay_us(graphs[label], calls))
    for label in order:
        r = res["runs"][label]
        r["us"] = sorted(r["rounds_us"])[len(r["rounds_us"]) // 2]
        r["tbs"] = nbytes / r["us"] / 1e6
    return res


def best(cases: list[dict], min_batch: int) -> dict:
    """The label (`default` or a swept launch) with the lowest geometric mean time over the cases from
    `min_batch` up, timed in all of them (gpu_attn_bench._geomean_best); its ratio to `default` there, per case
    and overall."""
    cases = [c for c in cases if c["batch"] >= min_batch]
    timed = lambda lab: all("us" in c["runs"].get(lab, {}) for c in cases)  # noqa: E731
    lab = attn._geomean_best(cases, lambda _: True) if cases else None
    if lab is None or not timed("default"):
        return {"label": None}
    log_ratio = sum(math.log(c["runs"]["default"]["us"] / c["runs"][lab]["us"]) for c in cases) / len(cases)
    return {"label": lab, "geomean_speedup": math.exp(log_ratio),
            "per_case_speedup": {f"{c['batch']}x{c['mean_len']:.0f}": c["runs"]["default"]["us"] / c["runs"][lab]["us"]
                                 for c in cases}}


def entry_for(label: str, min_batch: int, sm_major: int) -> dict | None:
    """A `bf16` entry for DECODE_CONFIG giving `label`'s launch (`default`: the launch DECODE_CONFIG gave it) from
    min_batch up, gated on the shape and GPU it was timed at (None: that launch is DECODE_CONFIG's top-level one,
    i.e. no entry won). The keys are where the launch differs from the top level (no pool entry): the same entry
    whatever DECODE_CONFIG's `bf16` entry is when the sweep runs."""
    bs = max(min_batch, 2)
    ran = da.resolve_config(bs, pool="bf16", head_dim=attn.HEAD_DIM, kv_heads=attn.KV_HEADS)
    cfg = ran if label == "default" else sweep_configs().get(label)
    top = da.resolve_config(bs)
    if cfg is None or all(cfg[k] == top[k] for k in ENTRY_KEYS):
        return None
    return {**{k: cfg[k] for k in ENTRY_KEYS if cfg[k] != top[k]}, "min_batch": min_batch,
            "head_dim": attn.HEAD_DIM, "min_kv_heads": attn.KV_HEADS, "sm_major": sm_major}


def print_table(res: dict) -> None:
    print(f"\n{res['gpu']}  torch {res['torch']}  triton {res['triton']}")
    for name, c in res["cases"].items():
        base = c["runs"]["default"].get("us")
        print(f"\n{name}: batch {c['batch']}, mean length {c['mean_len']:.0f}, K+V {c['kv_mb']:.0f} MB")
        print(f"  {'variant':22} {'launch':>10} {'splits':>6} {'us':>8} {'TB/s':>5} {'vs dflt':>7} {'spread':>6} "
              f"{'err':>7} {'vs dflt out':>11} {'smem':>7} {'regs':>4}")
        for lab, r in sorted(c["runs"].items(), key=lambda kv: kv[1].get("us", 1e9)):
            if "us" in r:
                spread = (max(r["rounds_us"]) - min(r["rounds_us"])) / r["us"]
                ratio = (base or 0) / r["us"]
                print(f"  {lab:22} {r['launch']:>10} {r['splits']:6} {r['us']:8.1f} {r['tbs']:5.2f} {ratio:7.3f} "
                      f"{spread:6.3f} {r['err']:7.4f} {r['vs_default']:11.5f} {r.get('shared', 0):7} "
                      f"{r.get('regs', 0):4}")
            else:
                print(f"  {lab:22} {r['splits']:6}  FAILED {r.get('failed') or 'error %.4f' % r['err']}")
    print(f"\nbest: {json.dumps(res['best'])}\nentry: {json.dumps(res['entry'])}")


def main() -> None:
    ap = attn.arg_parser(__doc__, CASES, "bf16_attn_bench.json", "default")
    ap.add_argument("--min-batch", type=int, default=256, help="the entry applies from this batch size up")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per case (median kept)")
    opts = ap.parse_args()
    for name in opts.cases.split(","):
        if name not in CASES:
            ap.error(f"unknown case {name!r}; cases: {','.join(CASES)}")
    out = attn.run_sweep(opts, precompile, lambda name, pattern, sms: bench_case(name, pattern, sms, opts.rounds))
    cases = list(out["cases"].values())
    out["best"] = best(cases, opts.min_batch)
    sm_major = torch.cuda.get_device_capability()[0]
    out["entry"] = entry_for(out["best"]["label"], opts.min_batch, sm_major) if out["best"]["label"] else None
    with open(os.path.join(opts.out, "bf16_attn_bench.json"), "w") as f:
        json.dump(out, f, indent=1)
    with open(os.path.join(opts.out, "bf16_attn_best.json"), "w") as f:
        json.dump({"best": out["best"], "entry": out["entry"]}, f, indent=1)
    print_table(out)
    for f in out["failures"]:
        print("FAILED:", f)
    if any("err" in r and "us" not in r and "failed" not in r for c in cases for r in c["runs"].values()):
        sys.exit("FAIL: variants above the error tolerance (see failures)")


if __name__ == "__main__":
    main()
