"""The scheduler's host time per decode step with every row JSON-constrained, in the engine, on the CPU.

The tiny model (dummy weights) with the default model's tokenizer, so the masks are real; overlap
scheduling on (as on CUDA), so constrained rows take the overlapped path; the schema of
benchmarks/constrained_gpu.py. One warm-up batch (the grammar compiled; its extra builds asked for,
then waited for), then `--runs` timed batches of `--rows` rows, greedy; per run the mean ms per step
of host_timeline.py's parts (the CPU forward pass is inside `launch` here: on the CPU it runs on the
host) and a SHA-1 of the outputs (runs of one tree must agree; before/after a change that keeps
outputs, too). The parts nest: `advance` holds `accept` and `jump`, `accept` holds `search`
(searches after forced tokens count under `jump` too), `sample` holds `fill`; `step` = `host_busy`
+ the wait for the pass read back.

    python benchmarks/host_step_cpu.py --rows 256 --runs 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from constrained_gpu import BACKENDS, MAX_NEW, SCHEMA, make_engine, prompts, use_backend  # noqa: E402
from host_timeline import HostTimeline  # noqa: E402

PARTS = ("step", "host_busy", "advance", "accept", "search", "jump", "fill", "sample", "launch", "untimed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=MAX_NEW)
    a = ap.parse_args()
    cpu = argparse.Namespace(smoke=True, tokenizer=None, backends=["llguidance"], grammar_threads=0)
    eng = make_engine(cpu, max_total_tokens=65536)  # room for 256 rows of 160 tokens
    use_backend(eng, "llguidance")
    ps = prompts(a.rows)
    params = [{"temperature": 0, "max_new_tokens": a.max_new_tokens, "json_schema": json.dumps(SCHEMA)}] * a.rows
    eng.generate(ps, [dict(p, max_new_tokens=64) for p in params])  # asks for the grammar's extra builds
    BACKENDS["llguidance"].compile("json_schema", json.dumps(SCHEMA)).wait_for_builds()
    for run in range(a.runs):
        t = time.perf_counter()
        with HostTimeline() as tl:
            outs = eng.generate(ps, params)
        wall = time.perf_counter() - t
        summary = tl.summary()  # {} when no step read a decode pass back
        mean = summary.get("mean", {})
        digest = hashlib.sha1(json.dumps([o["output_ids"] for o in outs]).encode()).hexdigest()[:12]
        tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
        print(json.dumps({"run": run, "wall_s": round(wall, 2), "tokens": tokens, "steps": summary.get("steps", 0), "sha1": digest,
                          **{k: mean.get(k) for k in PARTS}}), flush=True)  # fmt: skip
    eng.shutdown()


if __name__ == "__main__":
    main()
