"""Where the offline workload's decode steps go, from a gpu_bench.py results.json (no GPU needed).

    python benchmarks/offline_steps.py benchmarks/results/h200-2026-12-02-s7/call1_results.json

gpu_bench's offline sections (offline, offline_1k, in any variant) record every decode step of their
first seed's pass: (batch, KV tokens read, GPU ms). Arms of one run that run the same greedy workload
(--arms; by default offline, offline@fp8, offline@fp8kv8; offline_arms's as offline_arms/base) have steps
that pair one to one. This prints,
by batch-size band, each arm's mean step and the differences between arms (FP8 weights: what the
linear layers save; the FP8 KV cache: what attention saves), then a least-squares fit of each arm's
large-batch steps (batch >= --min-bs) on (1, batch, KV tokens), with the batch as is and rounded up to
tiles of 64, 128 and 256 rows. The per-row term holds everything a row costs (linears, output head,
norms, sampling), the per-KV-token term attention; the rounding that fits best suggests the GEMMs'
tile granularity.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

ARMS = ("offline", "offline@fp8", "offline@fp8kv8")
BANDS = ((1, 64), (65, 256), (257, 512), (513, 768), (769, 1024))


def steps_of(results: dict, arm: str) -> np.ndarray | None:
    """An arm's decode steps: those of its first seed's pass (offline), else of its one pass (offline_1k).
    `section/arm` names an arm inside a section that runs several (offline_arms/base)."""
    res = results
    for key in arm.split("/"):
        res = res.get(key, {}) if isinstance(res, dict) else {}
    run = next((v for k, v in res.items() if k.startswith("seed") and isinstance(v, dict)), res)
    rows = run.get("decode_steps_bs_kv_ms", run.get("decode_steps_bs_ctx_ms"))  # the second: its former name
    return np.array(rows, dtype=float) if rows else None


def band_table(arms: dict) -> list[str]:
    names = list(arms)
    first = arms[names[0]]
    lines = ["| batch | steps | mean batch | KV tokens (k) | " + " | ".join(f"{n} ms" for n in names)
             + (" | " + " | ".join(f"{a} - {b}" for a, b in zip(names, names[1:])) if len(names) > 1 else "") + " |"]
    lines.append("|" + " --- |" * (4 + 2 * len(names) - 1))
    for lo, hi in BANDS:
        m = (first[:, 0] >= lo) & (first[:, 0] <= hi)
        if not m.any():
            continue
        means = [float(arms[n][m, 2].mean()) for n in names]
        diffs = [f"{a - b:.2f}" for a, b in zip(means, means[1:])]
        lines.append(f"| {lo}-{hi} | {int(m.sum())} | {first[m, 0].mean():.0f} | {first[m, 1].mean() / 1e3:.0f} | "
                     + " | ".join(f"{x:.2f}" for x in means) + (" | " + " | ".join(diffs) if diffs else "") + " |")
    totals = [f"{arms[n][:, 2].sum() / 1e3:.2f} s" for n in names]
    lines.append(f"| all | {len(first)} | {first[:, 0].mean():.0f} | {first[:, 1].mean() / 1e3:.0f} | " + " | ".join(totals)
                 + (" | " + " | ".join("" for _ in names[1:]) if len(names) > 1 else "") + " |")
    return lines


def tile_fits(a: np.ndarray, min_bs: int) -> dict:
    """{rounding: (rms residual ms, fixed ms, ms per row, ms per 1k KV tokens)} over steps with batch >= min_bs."""
    a = a[a[:, 0] >= min_bs]
    bs, kv, ms = a[:, 0], a[:, 1] / 1e3, a[:, 2]
    out = {}
    for tile in (1, 64, 128, 256):
        x = np.stack([np.ones_like(bs), np.ceil(bs / tile) * tile, kv], axis=1)
        coef, *_ = np.linalg.lstsq(x, ms, rcond=None)
        out[tile] = (float(np.sqrt(((ms - x @ coef) ** 2).mean())), *map(float, coef))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("results")
    p.add_argument("--min-bs", type=int, default=300, help="fit only steps of at least this batch (compute-bound linears)")
    p.add_argument("--arms", default=",".join(ARMS),
                   help="sections of one run, the same workload each (e.g. offline_1k@fp8,offline_1k@fp8kv8)")
    args = p.parse_args()
    results = json.load(open(args.results))
    names = args.arms.split(",")
    arms = {n: s for n in names if (s := steps_of(results, n)) is not None}
    if not arms:
        raise SystemExit(f"{args.results}: none of {names} has per-step records")
    if len(arms) < len(names):
        print(f"no per-step records, left out: {', '.join(n for n in names if n not in arms)}\n")
    first = next(iter(arms.values()))
    for n, s in arms.items():
        if s.shape != first.shape or not np.array_equal(s[:, :2], first[:, :2]):
            raise SystemExit(f"{n}: its steps differ in batch or KV tokens from the first arm's; they do not pair")
    print("\n".join(band_table(arms)))
    print(f"\nfits over steps with batch >= {args.min_bs}: step ms = fixed + per_row * rows(tile) + per_1k_kv * KV tokens / 1000")
    for n, s in arms.items():
        for tile, (rms, fixed, row, kv) in tile_fits(s, args.min_bs).items():
            label = "batch as is" if tile == 1 else f"rounded up to {tile}"
            print(f"{n:16s} {label:16s} rms {rms:.3f} ms  fixed {fixed:6.2f}  per row {row:.4f}  per 1k KV {kv:.4f}")


if __name__ == "__main__":
    main()
