"""Decode attention over an FP8 KV pool: launch variants against the bf16 pool, Llama-3-8B heads, one GPU:

    python3 benchmarks/fp8_attn_bench.py --out $OUT/fp8attn [--cases 256x1536,512x660] [--variants REGEX] [--kv-heads 4]

Cases: batch 8, 32, 64, 256 and 512 at 660 and 1,536 tokens a request, and bf16_attn_bench's offline-pass shapes
(768xU, 544xU, 512x660, 384xU, 256xU: lengths drawn per case); by default the offline shapes and 256 / 512 x 1,536.
KV slots are a random permutation of the pool's (gpu_attn_bench.make_inputs). The FP8 pool holds the
same K / V with one scale per KV head (amax / 448: benchmarks/gpubench/fp8_kernels.fp8_pool). Heads: Llama-3-8B's
(8 KV heads of 128, 4 query heads to each), or with --kv-heads N a tensor-parallel rank's N KV heads (4N query heads).

Labels always timed (LAUNCHES): `bf16` the bf16 pool with DECODE_CONFIG as it stands (since issue 28, 2 warps
from batch 256 on an H200: its `bf16` entry); `bf16_4w` the bf16 pool's 4-warp launch spelt out (64-token
blocks, 3 stages, no pool entry: the ratios' baseline, the launch `bf16` was before issue 28);
`fp8_bf16_launch` the FP8 pool through that 4-warp launch with V widened after its shared-memory read;
`fp8_bf16_launch_v_regs` the same launch with V widened in registers (DECODE_CONFIG's fp8_v_regs); `fp8_entry` /
`fp8_fallback` DECODE_CONFIG's `fp8` / `fp8_fallback` entry's launch at every batch size and shape (gates set
aside); `fp8_default` the FP8 pool with DECODE_CONFIG as it stands (whichever entry's gates pass). Every other label
(--variants picks them; '^$' for none) is an `fp8` entry swept (block_n / num_warps / num_stages, `_wv` waves,
`_e2` fp8_exp2) with V widened in registers, and
`bf16_*` the bf16 pool with another whole launch (information only). Every run also records `launch`, what
its config resolved to (gpu_attn_bench.launch_label). Each variant is checked against
the float32 reference over the pool it reads (the dequantized FP8 pool: the kernel's error, not
e4m3's; max abs error > 2e-2 fails loudly: listed, not timed, exit 1), then timed per layer call in a
CUDA graph: us, and TB/s of the pool bytes read. Each case also runs gather_probe.py (the pools' rows gathered
and summed, no attention: the read rate the layout allows). Kernels are compiled first in --jobs processes.
Writes DIR/fp8_attn_bench.json, prints a table, and the swept entry with the lowest geometric mean
time over the cases from the entry's min_batch up, scored against fp8_default; with --write-config, if it
beats fp8_default, also puts that entry (with the current entry's gates) into DECODE_CONFIG's `fp8` in
radixflow/kernels/decode_config.py (for an engine benchmark that follows in the same call).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bf16_attn_bench  # noqa: E402
import gpu_attn_bench as attn  # noqa: E402
from gather_probe import probe_case  # noqa: E402
from gpubench.fp8_kernels import fp8_pool  # noqa: E402
from radixflow.kernels import reference as ref  # noqa: E402
from radixflow.kernels.decode_attention import DECODE_CONFIG, ENTRY_GATES, decode_attention, num_kv_splits  # noqa: E402
from radixflow.kernels.gemv import time_graph_us  # noqa: E402

CASES = {f"{bs}x{length}": (bs, length) for bs in (8, 32, 64, 256, 512) for length in (660, 1536)}
CASES.update(bf16_attn_bench.CASES)  # the offline pass's shapes: lengths drawn uniformly per case (seeded)
CASES["1000x1500"] = (1000, 1500)  # the 1,000 in / 1,000 out workload's mean context
SWEEP_CASES = "768xU,544xU,512x660,384xU,256xU,256x1536,512x1536"
# The 16-bit pool's launch before issue 28's `bf16` entry (2 warps from batch 256 on an H200), spelt out with
# no pool entry so it stays the same launch whatever DECODE_CONFIG's entries become: the FP8 row's baseline.
BF16_4W = {"block_n": 64, "num_warps": 4, "num_stages": 3, "bf16": {}}
FP8_4W = {"block_n": 64, "num_warps": 4, "num_stages": 3, "fp8": {}}  # the FP8 pool through that launch
FP8_BF16_LAUNCH = {**FP8_4W, "fp8_v_regs": False}  # ... with V widened after shared memory
LAUNCHES = {  # label: (FP8 pool?, config), timed in every case; `bf16` / `fp8_default`: DECODE_CONFIG as it stands
    "bf16": (False, None), "bf16_4w": (False, BF16_4W), "fp8_bf16_launch": (True, FP8_BF16_LAUNCH),
    "fp8_bf16_launch_v_regs": (True, FP8_4W),
    **{lab: (True, {"fp8": {k: v for k, v in DECODE_CONFIG[name].items() if k not in ENTRY_GATES[name]}})
       for lab, name in (("fp8_entry", "fp8"), ("fp8_fallback", "fp8_fallback"))},
    "fp8_default": (True, None),
}
# `fp8` entries timed: (block_n, num_warps, num_stages, other keys)
# (Triton pipelines the gathered K / V one block ahead below 5 stages, two blocks ahead at 5: more bytes in flight.)
# With DECODE_CONFIG's fp8_exp2 (`_e2`): the entry before issue 28's session 11 (128 / 4 / 5, now `fp8_fallback`)
# with it, and the neighbours of session 11's pick (64 / 2 / 5, e2). Session 11's own sweep (K widened in registers,
# one warp a sub-block and KV heads first in the grid too, all since removed) is in benchmarks/results/*-s11-fp8attn.
E2 = {"fp8_exp2": True}
SWEEP = [
    (128, 4, 5, E2), (64, 2, 3, {}), (64, 2, 3, E2), (64, 2, 5, {}), (64, 2, 4, E2), (64, 2, 6, E2),
    (32, 2, 5, E2), (32, 2, 8, E2),
    # session 15: one warp a program (more programs an SM), and deeper pipelines at 2 warps
    (64, 1, 3, E2), (64, 1, 5, E2), (32, 1, 5, E2), (32, 1, 8, E2), (128, 2, 5, E2), (64, 2, 8, E2),
    # session 16: Nsight Compute found 64 / 2 / 5 at 2 warps a scheduler (4 programs an SM, held by both its 180
    # registers a thread and its 56 KB of shared memory) and latency-bound: registers capped (`_r`), fewer stages
    *[(n, w, s, {**E2, "maxnreg": r}) for n, w, s, r in ((64, 2, 3, 168), (64, 2, 3, 128), (64, 2, 4, 168),
                                                        (64, 2, 4, 128), (64, 2, 5, 128), (32, 2, 5, 128),
                                                        (32, 2, 4, 128), (32, 1, 5, 128), (32, 1, 5, 168))],
    (64, 4, 3, E2), (64, 4, 5, E2),
    # ... then one warp (32 / 1 / 5 at 168 registers: 807 against 880 us at 1,000 x 1,500) at its neighbours
    *[(n, 1, s, {**E2, "maxnreg": r}) for n, s, r in ((32, 5, 144), (32, 5, 160), (32, 5, 176), (32, 5, 192),
                                                     (32, 4, 168), (32, 6, 168), (16, 8, 168))],
]
FLAGS = {"fp8_exp2": "e2"}  # label suffixes
# the bf16 pool with 5 stages too (gpu_attn_bench sweeps other bf16 launches): does the deeper pipeline help it?
BF16_EXTRA = [{**BF16_4W, "num_stages": 5}]  # whole launches, no pool entry: labelled `bf16_` + _label


def _entry(v: tuple) -> dict:
    n, w, s, extra = v
    return {"block_n": n, "num_warps": w, "num_stages": s, **extra}


def _label(entry: dict) -> str:
    tail = f"_wv{entry['waves']}" if "waves" in entry else ""
    tail += "".join(f"_{short}" for key, short in FLAGS.items() if entry.get(key))
    tail += f"_r{entry['maxnreg']}" if entry.get("maxnreg") else ""
    return f"n{entry['block_n']}w{entry['num_warps']}s{entry['num_stages']}{tail}"


def _pool(fp8: bool) -> str:
    return "fp8" if fp8 else "bf16"


def variants(pattern: str) -> list[tuple[str, bool, dict | None]]:
    """(label, FP8 pool?, config) to time: LAUNCHES, then the swept variants whose label matches `pattern`."""
    sweep = [(_label(e), True, {"fp8": e}) for e in map(_entry, SWEEP)]
    sweep += [(f"bf16_{_label(cfg)}", False, cfg) for cfg in BF16_EXTRA]
    return [(lab, fp8, cfg) for lab, (fp8, cfg) in LAUNCHES.items()] + [s for s in sweep if re.search(pattern, s[0])]


def fp8_pool_dequantized(x: dict) -> tuple:
    """fp8_kernels.fp8_pool's FP8 pool of the inputs' K / V, its scales, and the pool dequantized (float32)."""
    pool, scales = fp8_pool(x)
    return pool, scales, [p.float() * s[None, :, None] for p, s in zip(pool, scales)]


def _splits(bs: int, fp8: bool, cfg: dict | None, sms: int) -> int:
    return num_kv_splits(bs, attn.KV_HEADS, sms, config=cfg, pool=_pool(fp8), head_dim=attn.HEAD_DIM)


def precompile(names: list[str], pattern: str, sms: int, jobs: int) -> None:
    tasks = {}
    for name in names:
        bs = CASES[name][0]
        for _, fp8, cfg in variants(pattern):
            splits = _splits(bs, fp8, cfg, sms)
            tasks[json.dumps([fp8, cfg, splits])] = (cfg, splits, True, fp8)
    attn.compile_in_processes(list(tasks.values()), jobs)


def case_lengths(name: str) -> list[int]:
    bs, length = CASES[name]
    return [length] * bs if isinstance(length, int) else bf16_attn_bench.case_lengths(name)


def bench_case(name: str, pattern: str, sms: int) -> dict:
    lens = case_lengths(name)
    bs, length = len(lens), sum(lens) / len(lens)
    x = attn.make_inputs(lens)
    (k8, v8), scales, deq = fp8_pool_dequantized(x)
    idx, q = x["idx"][0], x["q"]
    want = {False: ref.decode_attention_ref(q.float(), x["k"], x["v"], x["table"], idx, x["lens"], attn.SCALE),
            True: ref.decode_attention_ref(q.float(), *deq, x["table"], idx, x["lens"], attn.SCALE)}
    del deq
    nbytes = attn.kv_bytes(lens)  # the bf16 pool's; the FP8 pool's is half
    res = {"batch": bs, "len": length, "bf16_kv_mb": nbytes / 1e6, "runs": {}}
    for label, fp8, cfg in variants(pattern):
        splits = _splits(bs, fp8, cfg, sms)
        kv, sc = ((k8, v8), scales) if fp8 else ((x["k"], x["v"]), None)

        def run(i: int, kv=kv, sc=sc, cfg=cfg, splits=splits):
            return decode_attention(q, *kv, x["table"], x["idx"][i % x["copies"]], x["lens"], attn.SCALE, splits,
                                    config=cfg, scales=sc)

        r = res["runs"][label] = {"splits": splits, "launch": attn.launch_label(bs, cfg, _pool(fp8))}
        try:
            r["err"] = (run(0).float() - want[fp8]).abs().max().item()
            if not r["err"] <= attn.TOL:
                print(f"FAIL {name} {label}: max abs error {r['err']:.4f} > {attn.TOL}", flush=True)
                continue
            r["us"] = time_graph_us(run, max(x["copies"], 4))
            r["tbs"] = (nbytes // 2 if fp8 else nbytes) / r["us"] / 1e6
        except Exception as e:  # a config the compiler or the GPU rejects: report it, keep sweeping
            r["failed"] = repr(e)[:300]
    res["probe"] = probe_case(x, (k8, v8))
    return res


def best_entry(cases: list[dict]) -> tuple[str | None, dict | None]:
    """The swept `fp8` entry, or fp8_default (entry None), with the lowest geometric mean time over the
    `cases` from DECODE_CONFIG's fp8 min_batch up (where a written entry would apply), timed in all of them."""
    cases = [c for c in cases if c["batch"] >= DECODE_CONFIG["fp8"].get("min_batch", 0)]
    entries = {_label(e): e for e in map(_entry, SWEEP)}
    timed = [lab for lab in [*entries, "fp8_default"] if cases and all("us" in c["runs"].get(lab, {}) for c in cases)]
    score = {lab: sum(math.log(c["runs"][lab]["us"]) for c in cases) for lab in timed}
    lab = min(score, key=score.get) if score else None
    return lab, entries.get(lab)


CONFIG_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "radixflow", "kernels",
                           "decode_config.py")


def write_config(entry: dict) -> None:
    """DECODE_CONFIG's `"fp8": {...}` entry in the source replaced by `entry` with the current entry's gates
    (POOL_GATES: min_batch, head_dim, ...): the first `"fp8": {...}` in the file, DECODE_CONFIG's, its `large`
    launch included (the swept entry is one launch for every batch it covers)."""
    gates = {k: v for k, v in DECODE_CONFIG["fp8"].items() if k in ENTRY_GATES["fp8"]}
    text = open(CONFIG_FILE).read()
    source = "{" + ", ".join(f'"{k}": {v!r}' for k, v in {**entry, **gates}.items()) + "}"  # True, not JSON's true
    new, count = re.subn(r'"fp8": \{(?:[^{}]|\{[^{}]*\})*\}', lambda _: '"fp8": ' + source, text, count=1)
    assert count == 1, "DECODE_CONFIG's fp8 entry not found"
    with open(CONFIG_FILE, "w") as f:
        f.write(new)


# the table's "vs" columns, in order: the bf16 pool's 4-warp launch (the FP8 row's baseline before and after
# issue 28), the FP8 pool through it with V after shared memory, and with V in registers
RATIO_BASES = ("bf16_4w", "fp8_bf16_launch", "fp8_bf16_launch_v_regs")


def print_table(res: dict) -> None:
    print(f"\n{res['gpu']}  torch {res['torch']}  triton {res['triton']}")
    print("ratios: a base's time / the variant's (above 1: the variant is faster); bases: " + ", ".join(RATIO_BASES))
    for name, c in res["cases"].items():
        runs = c["runs"]
        bases = [runs[b].get("us") for b in RATIO_BASES]
        print(f"\n{name}: batch {c['batch']} x {c['len']:.0f} tokens (mean), bf16 K+V {c['bf16_kv_mb']:.0f} MB; "
              "gather probe TB/s: " + ", ".join(f"{k} {v['tbs']:.2f}" for k, v in c["probe"].items()))
        print(f"  {'variant':22} {'launch':>10} {'splits':>6} {'us':>8} {'TB/s':>5} {'vs bf16_4w':>10} {'vs launch':>9} "
              f"{'vs v_regs':>9} {'err':>7}")
        for lab, r in sorted(runs.items(), key=lambda kv: kv[1].get("us", 1e9)):
            if "us" in r:
                ratios = " ".join(f"{b / r['us'] if b else 0:{w}.2f}" for b, w in zip(bases, (10, 9, 9)))
                print(f"  {lab:22} {r['launch']:>10} {r['splits']:6} {r['us']:8.1f} {r['tbs']:5.2f} {ratios} "
                      f"{r['err']:7.4f}")
            else:
                print(f"  {lab:22} {r['splits']:6}  FAILED {r.get('failed') or 'error %.4f' % r['err']}")
    print(f"\nbest fp8 entry over the cases from min_batch {DECODE_CONFIG['fp8'].get('min_batch', 0)} up: {res['best']}")


def print_summary(res: dict) -> None:
    """One line a case: us of the bf16 pool's 4-warp launch, the FP8 pool through it with V in registers, the
    fp8_fallback and fp8 entries, the default; and the entry's speed-up over those two launches."""
    labels = ("bf16_4w", "fp8_bf16_launch_v_regs", "fp8_fallback", "fp8_entry", "fp8_default")
    print(f"\n{res['kv_heads']} KV heads\n{'case':10} " + " ".join(f"{lab:>22}" for lab in labels)
          + f" {'entry vs v_regs':>15} {'entry vs fallback':>17}")
    for name, c in res["cases"].items():
        us = [c["runs"][lab].get("us") or float("nan") for lab in labels]
        print(f"{name:10} " + " ".join(f"{u:22.1f}" for u in us) + f" {us[1] / us[3]:15.2f} {us[2] / us[3]:17.2f}")


def main() -> None:
    ap = attn.arg_parser(__doc__, CASES, "fp8_attn_bench.json", ", ".join(LAUNCHES))
    ap.set_defaults(cases=SWEEP_CASES)
    ap.add_argument("--write-config", action="store_true", help="put the best FP8 entry into DECODE_CONFIG's source")
    ap.add_argument("--kv-heads", type=int, default=8, help="KV heads (a tensor-parallel rank's; 4 query heads each)")
    opts = ap.parse_args()
    attn.set_kv_heads(opts.kv_heads)

    def bench_and_keep(name: str, pattern: str, sms: int) -> dict:  # each case kept as it ends: a call may be cut short
        res = bench_case(name, pattern, sms)
        with open(os.path.join(opts.out, "cases.jsonl"), "a") as f:
            f.write(json.dumps({name: res}) + "\n")
        fastest = sorted((r["us"], lab) for lab, r in res["runs"].items() if "us" in r)[:4]
        print(f"{name}: " + ", ".join(f"{lab} {us:.1f}" for us, lab in fastest), flush=True)
        return res

    out = {**attn.run_sweep(opts, precompile, bench_and_keep), "kv_heads": attn.KV_HEADS}
    label, entry = best_entry(list(out["cases"].values()))
    out["best"] = {"label": label, "fp8": entry}
    with open(os.path.join(opts.out, "fp8_attn_bench.json"), "w") as f:
        json.dump(out, f, indent=1)
    print_table(out)
    print_summary(out)
    for f in out["failures"]:
        print("FAILED:", f)
    if opts.write_config and entry is not None:
        write_config(entry)
        print(f"DECODE_CONFIG's fp8 entry written: {entry}")
    elif opts.write_config:
        print(f"DECODE_CONFIG's fp8 entry kept: no swept entry beat it ({label})")
    if out["failures"]:
        sys.exit("FAIL: variants failed or above the error tolerance (see failures)")


if __name__ == "__main__":
    main()
