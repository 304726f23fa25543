"""`--grammar-backend auto`'s first batch of a new grammar, on the CPU: its rows start on llguidance (compiled from
outlines' regex, slower masks) while the grammar's outlines compile runs; with the switch, rows still running when
the move finishes go on on outlines (GrammarBackend.switch_moved), without it they finish on llguidance.

The tiny model (dummy weights, overlap on) with the default model's tokenizer and constrained_gpu.py's regex or
schema. Each run gets a fresh auto backend that may move grammars (a CPU scheduler's does not: built here with
promote=True, as on a GPU), so every batch is its grammar's first. Per run: wall seconds, decode steps, the mean
ms a step of mask fill and of sampling (host_timeline.py), the outlines compile's seconds, rows switched, valid
outputs. Runs alternate switch on / off.

    python benchmarks/auto_first_batch_cpu.py --kind regex --rows 256 --runs 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from constrained_gpu import grammar_params, make_engine, prompts, valid  # noqa: E402
from host_timeline import HostTimeline  # noqa: E402

from radixflow.constrained.backend import GrammarBackend  # noqa: E402


def install(eng, switch: bool) -> tuple[GrammarBackend, list]:
    """A fresh auto backend that moves grammars, in place of the scheduler's, whose compile pools are shut
    down; the rows it switched, per call."""
    sched = eng.scheduler
    backend = GrammarBackend(sched.tokenizer, sched.runner.vocab_size, sched.eos_ids, sched.args, promote=True)
    switched: list = []
    real = backend.switch_moved
    backend.switch_moved = lambda reqs: switched.append(real(reqs) if switch else 0) or switched[-1]
    replaced = sched.grammar_backend
    sched.grammar_backend, sched.jump_forward, eng.builder.grammar_backend = backend, backend.jump_forward, "auto"
    if replaced is not None and replaced is not backend:
        shut_down(replaced)
    return backend, switched


def shut_down(backend: GrammarBackend) -> None:
    """The backend's compile threads: its grammars' pool and auto's moves' pool (work under way is dropped)."""
    for cache in filter(None, (backend.cache, backend.mover and backend.mover.compiles)):
        cache.pool.shutdown(wait=False, cancel_futures=True)


def run(eng, a, switch: bool) -> dict:
    backend, switched = install(eng, switch)
    params = [grammar_params(a.kind, a.temperature)] * a.rows
    t = time.perf_counter()
    with HostTimeline() as tl:
        outs = eng.generate(prompts(a.rows), params)
    wall = time.perf_counter() - t
    backend.wait_for_moves()
    moved = backend.mover.running
    mean = tl.summary().get("mean", {})
    return {"switch": switch, "kind": a.kind, "rows": a.rows, "wall_s": round(wall, 2), "steps": tl.summary().get("steps", 0),
            "fill_ms": mean.get("fill"), "sample_ms": mean.get("sample"), "host_busy_ms": mean.get("host_busy"),
            "move_s": round(moved.result().compile_s, 2) if moved is not None and moved.exception() is None else None,
            "switched": sum(switched), "tokens": sum(o["meta_info"]["completion_tokens"] for o in outs),
            "valid": sum(valid(a.kind, o["text"]) for o in outs)}  # fmt: skip


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=("regex", "json"), default="regex")
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--runs", type=int, default=2, help="runs of each setting (switch on, off, in turn)")
    ap.add_argument("--temperature", type=float, default=0.0)
    a = ap.parse_args(argv)
    if a.rows < 1 or a.runs < 1:
        ap.error(f"--rows {a.rows} and --runs {a.runs}: each at least 1")
    cpu = argparse.Namespace(smoke=True, tokenizer=None, backends=["auto"], grammar_threads=0, jump_forward_max_batch=None)
    eng = make_engine(cpu, max_total_tokens=65536)  # room for 256 rows of 160 tokens
    try:
        for _ in range(a.runs):
            for switch in (True, False):
                print(json.dumps(run(eng, a, switch)), flush=True)
    finally:
        eng.shutdown()


if __name__ == "__main__":
    main()
