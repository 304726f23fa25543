"""Request graphs vs eager on one in-process Engine, with wall and CPU time per mode: the
check behind `OMP_WAIT_POLICY=PASSIVE` (docs/programs.md, "CPU threads").

A batch of 12 three-gen programs runs as request graphs (one run_batch: the caller's thread
drives the engine) and eagerly (run_batch's worker threads share the engine), alternately.

    python benchmarks/programs/cpu_threads.py                          # radixflow's default (passive)
    OMP_WAIT_POLICY=ACTIVE python benchmarks/programs/cpu_threads.py    # libgomp spinning
"""

from __future__ import annotations

import argparse
import os
import time

import radixflow as rf  # sets OMP_WAIT_POLICY before torch loads, unless the environment does


@rf.function
def profile(s, name, max_tokens=16):
    s += f"Write a profile for {name}.\n"
    for field in ("Job", "City", "Hobby"):
        s += f"{field}:" + rf.gen(field.lower(), max_tokens=max_tokens, stop="\n") + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--modes", default="graph,eager,graph,eager")
    args = ap.parse_args()
    print(f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
    inputs = [{"name": f"Person {i}"} for i in range(args.n)]
    with rf.Engine() as engine:
        profile.run_batch(inputs[:2], backend=engine, temperature=0, progress_bar=False)  # warm-up
        for mode in args.modes.split(","):
            engine.flush_cache()
            steps = engine.stepper.steps
            wall, cpu = time.perf_counter(), time.process_time()
            profile.run_batch(inputs, backend=engine, mode=mode, temperature=0, progress_bar=False)
            print(
                f"{mode}: wall {time.perf_counter() - wall:.2f} s, cpu {time.process_time() - cpu:.2f} s, "
                f"engine turns {engine.stepper.steps - steps}",
                flush=True,
            )


if __name__ == "__main__":
    main()
