"""Medians of thread_cpu.py's JSON files, base against new: per workload and kind of round (same
inputs as the warm-up, fresh inputs), host-only ms a program, program threads' and engine thread's
CPU seconds a round.

    python summarize.py base_*.json -- new_*.json
"""

from __future__ import annotations

import json
import statistics
import sys


def load(paths: list) -> dict:
    out: dict = {}
    for p in paths:
        for name, rows in json.load(open(p)).items():
            for r in rows:
                out.setdefault((name, r["kind"]), []).append(r)
    return out


def main() -> None:
    split = sys.argv.index("--")
    base, new = load(sys.argv[1:split]), load(sys.argv[split + 1 :])
    print("| workload | rounds | host ms / program base -> new | program threads CPU s base -> new | engine thread CPU s base -> new |")
    print("| --- | --- | --- | --- | --- |")
    for key in base:
        cells = []
        for field in ("host_ms_per_program", "program_cpu_s", "engine_cpu_s"):
            b = statistics.median(r[field] for r in base[key])
            n = statistics.median(r[field] for r in new.get(key, [])) if key in new else float("nan")
            cells.append(f"{b:.3f} -> {n:.3f} ({n / b:.2f}x)")
        print(f"| {key[0]} | {key[1]} ({len(base[key])} / {len(new.get(key, []))}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
