"""--enable-mixed-chunk against without, on one machine: a server for each arm in turn (alternating, so drift
in the machine's load reaches both), the same Poisson load from benchmarks/serving.py on each, and a table of
output tok/s, TTFT, inter-token latency and end-to-end latency with the ratio of the medians over the repeats.

    python benchmarks/mixed_chunk_ab.py --repeats 2 -- --num-prompts 48 --request-rate 1.5 --input-len 256 --output-len 64
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
KEYS = ("output_tok_s", "mean_ttft_ms", "p50_itl_ms", "p99_itl_ms", "p50_e2e_ms")


def serve(port: int, extra: list) -> subprocess.Popen:
    log = tempfile.NamedTemporaryFile("w+", prefix="mixed-ab-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "radixflow", "serve", "--port", str(port), *extra],
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    deadline = time.time() + 300
    while "radixflow server ready at" not in open(log.name).read():
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise SystemExit(f"the server did not start; its log: {log.name}")
        time.sleep(0.5)
    return proc


def one_run(port: int, extra: list, load: list) -> dict:
    proc = serve(port, extra)
    try:
        with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as out:
            subprocess.run([sys.executable, os.path.join(HERE, "serving.py"), "--base-url", f"http://127.0.0.1:{port}",
                            "--output-json", out.name, *load], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
            return json.loads(out.read().splitlines()[-1])["summary"]
    finally:
        proc.terminate()
        proc.wait(60)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--port", type=int, default=31999)
    ap.add_argument("load", nargs="*", help="benchmarks/serving.py's arguments (after --)")
    args = ap.parse_args(argv)
    arms = {"separate passes": [], "--enable-mixed-chunk": ["--enable-mixed-chunk"]}
    runs: dict = {name: [] for name in arms}
    for r in range(args.repeats):
        for name, extra in (arms.items() if r % 2 == 0 else reversed(arms.items())):
            runs[name].append(one_run(args.port, extra, args.load))
            print(f"run {r + 1} {name}: " + ", ".join(f"{k} {runs[name][-1][k]:.1f}" for k in KEYS), flush=True)
    print("\n| arm | " + " | ".join(KEYS) + " |\n| --- |" + " --- |" * len(KEYS))
    med = {name: {k: statistics.median(s[k] for s in runs[name]) for k in KEYS} for name in arms}
    for name in arms:
        print(f"| {name} | " + " | ".join(f"{med[name][k]:.1f}" for k in KEYS) + " |")
    base, mixed = med["separate passes"], med["--enable-mixed-chunk"]
    print("| mixed / separate | " + " | ".join(f"{mixed[k] / base[k]:.3f}x" for k in KEYS) + " |")


if __name__ == "__main__":
    main()
