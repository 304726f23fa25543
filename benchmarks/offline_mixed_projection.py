"""Would decode rows riding in prefill chunks (mixed passes) shorten the offline pass? A projection, no GPU.

    python benchmarks/offline_mixed_projection.py benchmarks/results/h200-2026-12-02-s10-offline/results.json

The engine prefills every admitted request before it decodes (admission.py: an extend pass whenever one can
be formed). With mixed passes, the requests prefilled in earlier chunks would each decode one token in every
later chunk. This rebuilds the offline workload of one seed (gpubench.offline's requests), cuts its prompts into
chunks in arrival order, and prices each schedule from a recorded pass of that seed: prefill at the pass's
measured ms per token; a decode step of batch >= 300 from the fit of that pass's steps (fixed + per row + per
1,000 KV tokens), a smaller one at the mean measured step of that batch (the nearest batch if none); a decode
row inside a chunk at the fit's per-row and per-KV-token terms only (no fixed cost: the optimistic case).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from offline_steps import tile_fits  # noqa: E402


def workload(seed: int) -> list[tuple[int, int]]:
    """(prompt tokens, output tokens) of gpubench.offline's requests for `seed`, at its full sizes."""
    from gpubench.offline import offline_requests

    return [(len(prompt), out) for prompt, out in offline_requests(seed)]


STEP_KEYS = ("decode_steps_bs_kv_ms", "extend_gpu_s", "decode_gpu_s", "out_tokens")


def load_pass(path: str, key: str) -> tuple[int, dict]:
    """The seed and the record of the pass at `key` ('/'-separated, its last key seed<N>), with its steps."""
    last = key.rsplit("/", 1)[-1]
    if not (last.startswith("seed") and last[4:].isdigit()):
        raise SystemExit(f"--pass {key!r}: its last key names the seed, e.g. offline_row_block_ab/one_gemm/seed2024")
    rec = json.load(open(path))
    for k in key.split("/"):
        if not isinstance(rec, dict) or k not in rec:
            raise SystemExit(f"{path}: no {k!r} on the way to --pass {key!r}")
        rec = rec[k]
    missing = [k for k in STEP_KEYS if k not in rec]
    if missing:
        raise SystemExit(f"{path}: --pass {key!r} has no {', '.join(missing)}: pick a pass recorded with its steps "
                         "(a section's first seed)")
    return int(last[4:]), rec


class StepCost:
    def __init__(self, steps: np.ndarray, min_bs: int):
        self.steps, self.min_bs = steps, min_bs
        _, self.fixed, self.row, self.kv = tile_fits(steps, min_bs)[1]  # batch as is

    def step_ms(self, batch: int, kv_tokens: int) -> float:
        if batch >= self.min_bs:
            return self.fixed + self.row * batch + self.kv * kv_tokens / 1000
        same = self.steps[self.steps[:, 0] == batch]
        if not len(same):
            same = self.steps[[np.argmin(abs(self.steps[:, 0] - batch))]]
        return float(same[:, 2].mean())

    def row_ms(self, kv_tokens: int) -> float:
        return self.row + self.kv * kv_tokens / 1000


def project(reqs: list, cost: StepCost, prefill_ms_per_token: float, chunk: int, mixed: bool) -> dict:
    last_chunk, total = [], 0
    for prompt, _ in reqs:
        total += prompt
        last_chunk.append((total - 1) // chunk)
    left = np.array([out - 1 for _, out in reqs])  # the first token comes with the prefill
    kv = np.array([prompt + 1 for prompt, _ in reqs])
    done = np.array(last_chunk)
    in_chunks = 0.0
    if mixed:
        for j in range(1, last_chunk[-1] + 1):
            rows = (done < j) & (left > 0)
            in_chunks += float(np.sum(cost.row_ms(kv[rows])))
            left[rows] -= 1
            kv[rows] += 1
    decode, steps = 0.0, 0
    while (rows := left > 0).any():
        decode += cost.step_ms(int(rows.sum()), int(kv[rows].sum()))
        steps += 1
        left[rows] -= 1
        kv[rows] += 1
    prefill = total * prefill_ms_per_token
    return {"prefill_s": prefill / 1e3, "decode_rows_in_chunks_s": in_chunks / 1e3, "decode_s": decode / 1e3,
            "decode_steps": steps, "total_s": (prefill + in_chunks + decode) / 1e3}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", help="a gpu_bench.py results.json")
    p.add_argument("--pass", dest="pass_key", default="offline_row_block_ab/one_gemm/seed2024",
                   help="the recorded pass to price from: keys down to it, '/'-separated (it must hold its steps)")
    p.add_argument("--chunk", type=int, default=8192, help="prefill chunk tokens (gpu_bench's)")
    p.add_argument("--min-bs", type=int, default=300, help="decode steps of this batch and up are priced by the fit")
    args = p.parse_args(argv)
    seed, rec = load_pass(args.results, args.pass_key)
    reqs = workload(seed)
    if sum(o for _, o in reqs) != rec["out_tokens"]:  # the rebuilt workload is not the one the pass ran
        raise SystemExit(f"seed {seed}: the rebuilt workload has {sum(o for _, o in reqs):,} output tokens, the "
                         f"recorded pass {rec['out_tokens']:,}: gpubench.offline's requests changed since")
    steps = np.array(rec["decode_steps_bs_kv_ms"], dtype=float)
    prompt = sum(p for p, _ in reqs)
    cost = StepCost(steps, args.min_bs)
    print(f"seed {seed}: {prompt:,} prompt tokens, {sum(o for _, o in reqs):,} output tokens; recorded pass: extend "
          f"{rec['extend_gpu_s']:.2f} s, decode {rec['decode_gpu_s']:.2f} s in {len(steps)} steps; fit fixed "
          f"{cost.fixed:.2f} ms, {cost.row:.4f} ms a row, {cost.kv:.4f} ms per 1,000 KV tokens")
    for mixed in (False, True):
        r = project(reqs, cost, 1e3 * rec["extend_gpu_s"] / prompt, args.chunk, mixed)
        print(f"{'mixed passes' if mixed else 'prefill first'}: prefill {r['prefill_s']:.2f} s + decode rows in "
              f"chunks {r['decode_rows_in_chunks_s']:.2f} s + decode {r['decode_s']:.2f} s ({r['decode_steps']} steps) "
              f"= {r['total_s']:.2f} s")


if __name__ == "__main__":
    main()
