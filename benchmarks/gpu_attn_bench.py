"""Decode attention launch variants at Llama-3-8B heads on one GPU (CUDA only, ~1-2 min):

    python3 benchmarks/gpu_attn_bench.py --out $OUT/attn [--variants REGEX] [--cases 1x256,200x700]

Cases: 544 requests with lengths U[32, 1536] (offline serving), 200 x 700, 64 x 400 tokens, and
batch 1 at 256, 384 and 4096 tokens. KV slots are a random permutation of the pool's (a pool after
churn); small cases cycle over enough pool copies to exceed the L2 cache, as 32 layers do.

Every variant (a launch config of kernels/decode_attention.py, see kernels/decode_config.py) is checked
against the torch reference first (max abs error > 2e-2 fails loudly: listed, not timed, exit 1),
then timed per call inside a CUDA graph: us and TB/s of K+V bytes read. "old" is the launch
before the direct/PDL changes (8 warps, stage 2 always, no PDL), "default" today's DECODE_CONFIG.
The knobs swept: block_n / num_warps / num_stages, and over BASE split_align, max_splits, waves
and direct. Batch-1 cases run with PDL on and off. Kernels are compiled first in --jobs
processes (Triton's disk cache then serves this one). Writes DIR/attn_bench.json, prints a table
and a suggested DECODE_CONFIG (the best large-batch variant, plus the best batch-1 one as its
`small` entry).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import re
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gpubench (compile_worker's FP8 pools)

from radixflow.kernels import reference as ref  # noqa: E402
from radixflow.kernels.settings import KernelSettings  # noqa: E402
from radixflow.kernels.decode_attention import (  # noqa: E402
    DECODE_CONFIG, decode_attention, num_kv_splits, resolve_config,
)
from radixflow.kernels.gemv import time_graph_us  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, DTYPE, DEV = 32, 8, 128, torch.bfloat16, "cuda"
SCALE, TOL, L2_BYTES, WIDTH_ALIGN = HEAD_DIM**-0.5, 2e-2, 256 << 20, 64
CASES = {  # name: (batch, lengths: int or (low, high) uniform)
    "544xU": (544, (32, 1536)), "200x700": (200, 700), "64x400": (64, 400),
    "1x256": (1, 256), "1x384": (1, 384), "1x4096": (1, 4096),
}
BASE = {"block_n": 64, "num_warps": 4, "num_stages": 3, "waves": 4, "max_splits": 16, "split_align": 0, "direct": True,
        "fp8_exp2": False}
OLD = {**BASE, "num_warps": 8, "direct": False}  # the first kernel's launch; timed with PDL off
# (block_n, num_warps, num_stages, other keys) over BASE
LARGE = [
    (64, 4, 3, {}), (64, 8, 3, {}), (64, 8, 5, {}), (32, 4, 3, {}), (128, 8, 3, {}), (64, 4, 3, {"direct": False}),
    (64, 4, 3, {"waves": 8}), (64, 4, 3, {"waves": 2}),
]
SMALL = [
    (16, 4, 2, {}), (32, 4, 3, {}), (64, 4, 3, {"split_align": 16}), (64, 8, 3, {"split_align": 16}),
    (64, 4, 3, {"split_align": 16, "max_splits": 32}), (32, 4, 3, {"split_align": 16, "max_splits": 32}),
    (64, 4, 3, {"split_align": 16, "max_splits": 64}), (64, 4, 3, {"split_align": 32, "max_splits": 8}),
]
SHORT = {"split_align": "a", "max_splits": "ms", "waves": "wv", "direct": "direct", "fp8_exp2": "e2"}


def _variant(v: tuple) -> dict:
    n, w, s, extra = v
    return {**BASE, "block_n": n, "num_warps": w, "num_stages": s, **extra}


def _name(cfg: dict) -> str:
    changed = [(k, v) for k, v in cfg.items() if k in SHORT and v != BASE[k]]
    tail = "".join(f"_no{SHORT[k]}" if v is False else f"_{SHORT[k]}" + ("" if v is True else str(v))
                   for k, v in changed)
    return f"n{cfg['block_n']}w{cfg['num_warps']}s{cfg['num_stages']}{tail}"


def variants(batch: int, pattern: str) -> list[tuple[str, dict | None, bool]]:
    """(label, config or None for DECODE_CONFIG, PDL) to run at this batch size."""
    sweep = {_name(c): c for c in map(_variant, SMALL if batch == 1 else LARGE)}
    runs = [("old", OLD, False), ("default", None, True)] + [(n, c, True) for n, c in sweep.items()]
    if batch == 1:  # PDL off too
        runs += [(f"{n}/nopdl", c, False) for n, c, on in runs if on]
    return [r for r in runs if r[0] in ("old", "default") or re.search(pattern, r[0])]


def set_kv_heads(kv_heads: int) -> None:
    """A tensor-parallel rank's heads: `kv_heads` KV heads, Llama-3-8B's 4 query heads to each (8: the whole model)."""
    global HEADS, KV_HEADS
    HEADS, KV_HEADS = 4 * kv_heads, kv_heads


def case_lengths(name: str) -> list[int]:
    bs, lens = CASES[name]
    if isinstance(lens, int):
        return [lens] * bs
    gen = torch.Generator().manual_seed(0)
    return torch.randint(lens[0], lens[1] + 1, (bs,), generator=gen).tolist()


def kv_bytes(lens: list[int]) -> int:
    return sum(lens) * KV_HEADS * HEAD_DIM * DTYPE.itemsize * 2


def make_inputs(lens: list[int]) -> dict:
    """A pool holding `copies` sets of the batch's KV on randomly permuted slots (slot 0 unused),
    a req_to_token table with a row per (copy, request), and a req_pool_indices tensor per copy."""
    bs, copies = len(lens), max(1, min(128, -(-L2_BYTES // kv_bytes(lens))))
    total = sum(lens) * copies
    k = torch.randn(total + 1, KV_HEADS, HEAD_DIM, device=DEV, dtype=DTYPE)
    v = torch.randn_like(k)
    width = -(-max(lens) // WIDTH_ALIGN) * WIDTH_ALIGN
    lens_t = torch.tensor(lens, device=DEV)
    used = (torch.arange(width, device=DEV)[None, :] < lens_t[:, None]).repeat(copies, 1)
    table = torch.zeros(copies * bs, width, dtype=torch.int32, device=DEV)
    table[used] = (torch.randperm(total, device=DEV) + 1).int()
    idx = [torch.arange(bs, device=DEV) + c * bs for c in range(copies)]
    q = torch.randn(bs, HEADS, HEAD_DIM, device=DEV, dtype=DTYPE)
    return {"q": q, "k": k, "v": v, "table": table, "idx": idx, "lens": lens_t, "copies": copies}


def _splits(bs: int, cfg: dict | None, sms: int) -> int:
    return num_kv_splits(bs, KV_HEADS, sms, config=cfg, pool="bf16", head_dim=HEAD_DIM)


def launch_label(bs: int, cfg: dict | None, pool: str = "bf16") -> str:
    """`_name` of the launch `cfg` resolves to at this batch size, pool kind and the bench's heads on this GPU
    (DECODE_CONFIG's entries included): what ran, whatever the variant's label says."""
    return _name(resolve_config(bs, cfg, pool=pool, head_dim=HEAD_DIM, kv_heads=KV_HEADS))


def compile_worker(tasks: list, kv_heads: int = 8) -> None:
    """Run each (config, splits, pdl, FP8 pool?) once on tiny inputs of the same specialisation (`kv_heads`:
    set_kv_heads), which puts its kernels in Triton's disk cache. Errors are left for the main process to report."""
    from gpubench.fp8_kernels import fp8_pool

    set_kv_heads(kv_heads)
    x = make_inputs([40, 5])
    pools = {False: ((x["k"], x["v"]), None), True: fp8_pool(x)}
    for cfg, splits, on, fp8 in tasks:
        try:
            decode_attention(x["q"], *pools[fp8][0], x["table"], x["idx"][0], x["lens"], SCALE, splits, config=cfg,
                             scales=pools[fp8][1], settings=KernelSettings(pdl=on))
        except Exception:
            pass
    try:
        torch.cuda.synchronize()
    except Exception:
        pass


def precompile(names: list[str], pattern: str, sms: int, jobs: int) -> None:
    tasks = {}
    for name in names:
        bs = CASES[name][0]
        for _, cfg, on in variants(bs, pattern):
            tasks[json.dumps([cfg, _splits(bs, cfg, sms), on])] = (cfg, _splits(bs, cfg, sms), on, False)
    compile_in_processes(list(tasks.values()), jobs)


def compile_in_processes(todo: list, jobs: int) -> None:
    """compile_worker over `todo` dealt out to `jobs` spawned processes, which fills Triton's disk cache."""
    if jobs <= 1 or not todo:
        return
    try:  # a worker that dies (a compiler crash) breaks the pool instead of hanging it
        with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
            list(pool.map(compile_worker, [todo[i::jobs] for i in range(jobs)], [KV_HEADS] * jobs))
    except Exception as e:
        print(f"precompile failed ({e!r}); compiling in this process instead", flush=True)


def run_sweep(opts: argparse.Namespace, precompile: Callable[[list[str], str, int, int], None],
              bench_case: Callable[[str, str, int], dict]) -> dict:
    """arg_parser's options parsed: compile every kernel up front, then bench_case(name, pattern, SMs) for
    each case. Returns the run's header (GPU, versions, DECODE_CONFIG), the cases, and the variants that
    failed or missed the tolerance."""
    import triton

    assert torch.cuda.is_available(), "CUDA only"
    os.makedirs(opts.out, exist_ok=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    names = opts.cases.split(",")
    precompile(names, opts.variants, sms, opts.jobs)
    out: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                 "decode_config": DECODE_CONFIG, "cases": {}}
    for name in names:
        out["cases"][name] = bench_case(name, opts.variants, sms)
        torch.cuda.empty_cache()
        print(f"{name} done", flush=True)
    out["failures"] = [f"{c} {lab}: {r.get('failed') or r['err']}" for c, res in out["cases"].items()
                       for lab, r in res["runs"].items() if "us" not in r]
    return out


def bench_case(name: str, pattern: str, sms: int) -> dict:
    lens = case_lengths(name)
    bs, x = len(lens), make_inputs(lens)
    args = (x["q"], x["k"], x["v"], x["table"])
    want = ref.decode_attention_ref(*args, x["idx"][0], x["lens"], SCALE)
    res = {"batch": bs, "mean_len": sum(lens) / bs, "kv_mb": kv_bytes(lens) / 1e6, "copies": x["copies"], "runs": {}}
    for label, cfg, on in variants(bs, pattern):
        splits = _splits(bs, cfg, sms)

        def run(i: int, cfg=cfg, splits=splits, settings=KernelSettings(pdl=on)):
            return decode_attention(*args, x["idx"][i % x["copies"]], x["lens"], SCALE, splits, config=cfg,
                                    settings=settings)

        r = res["runs"][label] = {"splits": splits, "pdl": on, "launch": launch_label(bs, cfg)}
        try:
            r["err"] = (run(0).float() - want.float()).abs().max().item()
            if not r["err"] <= TOL:
                print(f"FAIL {name} {label}: max abs error {r['err']:.4f} > {TOL}", flush=True)
                continue
            r["us"] = time_graph_us(run, max(x["copies"], 4))
            r["tbs"] = kv_bytes(lens) / r["us"] / 1e6
        except Exception as e:  # a config the compiler or the GPU rejects: report it, keep sweeping
            r["failed"] = repr(e)[:300]
    return res


def _geomean_best(cases: list[dict], keep) -> str | None:
    """The label with the lowest geometric mean time over `cases` (timed in all of them)."""
    labels = [lab for lab in cases[0]["runs"] if keep(lab) and all("us" in c["runs"].get(lab, {}) for c in cases)]
    score = {lab: sum(math.log(c["runs"][lab]["us"]) for c in cases) for lab in labels}
    return min(score, key=score.get) if score else None


def suggest(results: dict) -> dict:
    """DECODE_CONFIG from the sweep: the best large-batch variant, with the best batch-1 one (PDL on)
    as its `small` entry where it differs."""
    large = [c for c in results.values() if c["batch"] > 1]
    small = [c for c in results.values() if c["batch"] == 1]
    configs = {_name(c): c for c in map(_variant, LARGE + SMALL)}
    pick = lambda cases: _geomean_best(cases, lambda lab: lab in configs) if cases else None  # noqa: E731
    big, one = pick(large), pick(small)
    out = dict(configs[big]) if big else {k: v for k, v in DECODE_CONFIG.items() if k != "small"}
    out["small"] = {"max_batch": 0}
    if one:
        out["small"] = {"max_batch": 1, **{k: v for k, v in configs[one].items() if out.get(k) != v}}
    return {"config": out, "large_pick": big, "batch1_pick": one}


def arg_parser(doc: str, cases: dict, json_name: str, always: str) -> argparse.ArgumentParser:
    """The options both attention sweeps take: --out, --cases, --variants, --jobs."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help=f"directory for {json_name}")
    ap.add_argument("--cases", default=",".join(cases), help="comma-separated subset of " + ",".join(cases))
    ap.add_argument("--variants", default=".", help=f"regex over variant labels ({always} always run)")
    ap.add_argument("--jobs", type=int, default=12, help="processes compiling kernels up front (1: none)")
    return ap


def main() -> None:
    ap = arg_parser(__doc__, CASES, "attn_bench.json", "old and default")
    ap.add_argument("--top", type=int, default=12, help="fastest variants printed per case (the JSON has all)")
    opts = ap.parse_args()
    out = run_sweep(opts, precompile, bench_case)
    out["suggested"] = suggest(out["cases"])
    with open(os.path.join(opts.out, "attn_bench.json"), "w") as f:
        json.dump(out, f, indent=1)
    print_table(out, opts.top)
    if any("err" in r and "us" not in r for res in out["cases"].values() for r in res["runs"].values()):
        sys.exit("FAIL: variants above the error tolerance (see failures)")


def print_table(res: dict, top: int = 12) -> None:
    print(f"\n{res['gpu']}  torch {res['torch']}  triton {res['triton']}")
    for name, c in res["cases"].items():
        old = c["runs"]["old"].get("us")
        print(f"\n{name}: batch {c['batch']}, mean length {c['mean_len']:.0f}, K+V {c['kv_mb']:.1f} MB, "
              f"{c['copies']} pool copies")
        print(f"  {'variant':42} {'splits':>6} {'us':>8} {'TB/s':>5} {'vs old':>6} {'err':>7}")
        ranked = sorted(c["runs"].items(), key=lambda kv: kv[1].get("us", 1e9))
        for rank, (lab, r) in enumerate(ranked):
            if rank >= top and lab not in ("old", "default", "default/nopdl") and "us" in r:
                continue
            if "us" in r:
                print(f"  {lab:42} {r['splits']:6} {r['us']:8.2f} {r['tbs']:5.2f} {old / r['us'] if old else 0:6.2f} "
                      f"{r['err']:7.4f}")
            else:
                print(f"  {lab:42} {r['splits']:6}  FAILED {r.get('failed') or 'error %.4f' % r['err']}")
    s = res["suggested"]
    print(f"\nlarge-batch pick {s['large_pick']}, batch-1 pick {s['batch1_pick']}\nDECODE_CONFIG = {s['config']}")
    for f in res["failures"]:
        print("FAILED:", f)


if __name__ == "__main__":
    main()
