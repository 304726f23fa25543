"""A/B of two source trees in one GPU call: runs gpu_bench.py's sections from each tree in turn
(a subprocess per tree, so each imports its own radixflow), e.g. the main branch before a change
and the branch with it, on the same machine minutes apart.

    python3 benchmarks/ab_trees.py --trees before,after --sections bs1,prefill,offline \
        --offline-n 300 --tokenizer tok --out $OUT

Each tree is a copy of the repository (its own benchmarks/gpu_bench.py); results go to
OUT/<tree>/results.json, and a table of the chosen figures with after/before ratios is printed.
`--offline-n` shrinks `offline` (default 1000 requests) so both trees fit one call; `--graph-max-bs`
(default 256) is passed to both trees alike.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_RUN = """
import sys
tree, argv, offline_n = sys.argv[1], sys.argv[2:-1], int(sys.argv[-1])
sys.path[:0] = [tree, tree + "/benchmarks"]
import gpu_bench
if offline_n:
    gpu_bench.SZ["offline"] = offline_n
sys.argv = ["gpu_bench.py", *argv]
gpu_bench.main()
"""
FIGURES = {"bs1": ("tok_s",), "prefill": ("tok_s",), "offline": ("out_tok_s",)}


def run_tree(tree: str, out: str, args: argparse.Namespace) -> dict:
    argv = ["--out", out, "--sections", args.sections, "--offline-seeds", args.offline_seeds,
            "--graph-max-bs", str(args.graph_max_bs), "--tokenizer", os.path.abspath(args.tokenizer)] + (["--smoke"] if args.smoke else [])
    subprocess.run([sys.executable, "-c", _RUN, os.path.abspath(tree), *argv, str(args.offline_n)], check=False)
    path = os.path.join(out, "results.json")
    return json.load(open(path)) if os.path.exists(path) else {}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trees", required=True, help="two tree folders, before,after")
    p.add_argument("--sections", default="bs1,prefill,offline")
    p.add_argument("--offline-seeds", default="2024")
    p.add_argument("--offline-n", type=int, default=0)
    p.add_argument("--graph-max-bs", type=int, default=256,
                   help="CUDA graphs up to this decode batch in both trees (default 256: gpu_bench.py's own default "
                        "was 256 in older trees and is every batch in newer ones, so leaving it to each tree would "
                        "compare graph settings as well as the code)")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/ab-out"))
    p.add_argument("--smoke", action="store_true", help="CPU, tiny model: checks the plumbing only")
    args = p.parse_args()
    trees = args.trees.split(",")
    res = {t: run_tree(t, os.path.join(args.out, os.path.basename(t.rstrip("/"))), args) for t in trees}
    print("\n==== A/B ====")
    for section, keys in FIGURES.items():
        for key in keys:
            vals = [res[t].get(section, {}).get(key) for t in trees]
            ratio = f"{vals[1] / vals[0]:.3f}" if all(isinstance(v, (int, float)) for v in vals) else "-"
            print(f"{section}.{key}: " + "  ".join(f"{t}={v}" for t, v in zip(trees, vals)) + f"  ratio {ratio}")
    with open(os.path.join(args.out, "ab.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
