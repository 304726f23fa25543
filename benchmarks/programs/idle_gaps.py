"""Where the GPU sits idle in a graph round, and what the engine thread was doing meanwhile (issue 29:
the suite's "host-only s a round"). One warm round of each workload under torch.profiler (CUDA kernels and
copies only) while the engine thread logs its own intervals (scheduler step and its parts, the program
executor, the loop's turns). Every moment of the round that no kernel covers is charged to the innermost
engine-thread interval open then:

- lead / tail: before the round's first kernel / after its last;
- launch: inside a forward call (the pass's kernels are queued slower than the GPU runs them);
- admission, advance, sample, ...: the scheduler's parts (pass_timer.PHASES);
- step, other: the rest of a scheduler step;  executor: the program executor's on_step;
- turn, other: the loop's queued work (submissions from program threads) and its wakes;
- outside turns: the engine thread between turns (napping, or waiting for the GIL).

    python benchmarks/programs/idle_gaps.py --device cuda --config benchmarks/configs/llama3-8b.json \\
        --load-format dummy --tokenizer TOK --n 64 --size 1.0 --workloads mmlu,hellaswag

The round's start and end are anchored by a marker kernel each (the host's clock and the GPU's are matched
at the first; the second's offset is printed as the drift). Without CUDA it reports nothing useful: the
model runs on the host.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import radixflow as rf  # noqa: E402
from run import run_mode, warm_up  # noqa: E402
from pass_timer import phase_sites  # noqa: E402
from step_timeline import add_round_args, engine_kwargs  # noqa: E402

# innermost first: a moment inside several open intervals is charged to the first listed
LABELS = ("launch", "release", "admission", "input_logprobs", "cache_unfinished", "sample", "advance", "step",
          "executor", "turn")
GRID_US = 10.0


class HostLog:
    """(label, start, end) in perf_counter seconds for the wrapped calls made on the engine thread."""

    def __init__(self, engine) -> None:
        sched = engine.scheduler
        self.spans: list = []
        self._restore: list = []
        parts = [(engine.stepper, "_turn", "turn"), (sched, "step", "step"), (engine.programs, "on_step", "executor"),
                 (engine.runner, "forward", "launch"), *phase_sites(sched)]  # fmt: skip
        for obj, name, label in parts:
            fn = getattr(obj, name)
            self._restore.append((obj, name, fn))
            setattr(obj, name, self._wrap(fn, label))

    def _wrap(self, fn, label: str):
        def wrapped(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.spans.append((label, t, time.perf_counter()))

        return wrapped

    def close(self) -> None:
        for obj, name, fn in self._restore:
            setattr(obj, name, fn)


class SamplingThread:
    """While open, calls `sample()` every `interval_s` from a thread of its own, with the interpreter's switch
    interval shortened meanwhile (so that a thread running Python still lets the sampler in)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._switch = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch, self.interval_s / 2))
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        sys.setswitchinterval(self._switch)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        raise NotImplementedError


class StackSampler(SamplingThread):
    """Samples one thread's Python stack: (time, key) with key the innermost radixflow frame and the innermost
    frame of all, e.g. `scheduler.py:201 _run_extend > tensor`."""

    def __init__(self, thread_id: int, interval_s: float = 2e-4) -> None:
        super().__init__(interval_s)
        self.thread_id = thread_id
        self.samples: list = []

    def sample(self) -> None:
        frame = sys._current_frames().get(self.thread_id)
        if frame is not None:
            self.samples.append((time.perf_counter(), stack_key(frame)))


def stack_key(frame) -> str:
    leaf, own = frame.f_code.co_name, None
    while frame is not None and own is None:
        if "/radixflow/" in frame.f_code.co_filename:
            own = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return f"{own or '-'} > {leaf}"


def idle_stacks(samples: list, spans: list, h0: float, g0: float, top: int = 15) -> list:
    """The sampled stacks taken while no kernel ran, most frequent first: (key, share of idle samples)."""
    import bisect
    from collections import Counter

    merged: list = []  # the busy union: disjoint, sorted
    for s, e in spans:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    starts = [s for s, _ in merged]
    counts: Counter = Counter()
    for t, key in samples:
        g = g0 + (t - h0) * 1e6
        i = bisect.bisect_right(starts, g) - 1
        if i < 0 or merged[i][1] < g:
            counts[key] += 1
    total = sum(counts.values()) or 1
    return [(k, c / total) for k, c in counts.most_common(top)]


def engine_thread_id() -> int:
    ids = [t.ident for t in threading.enumerate() if t.name.startswith("rf-engine")]
    assert len(ids) == 1, f"one engine thread expected, found {len(ids)}"
    return ids[0]


def kernel_spans(prof) -> list:
    """(start, end) of every CUDA kernel and copy, in microseconds of the profiler's clock, sorted."""
    from torch.autograd import DeviceType

    return sorted((e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == DeviceType.CUDA)


def attribute(spans: list, host: list, h0: float, g0: float, h1: float, g1: float) -> dict:
    """Idle seconds of the round [h0, h1] (host clock) by the engine-thread label open then; kernel
    times map to the host's clock by h = h0 + (g - g0)."""
    import numpy as np

    n = int((h1 - h0) * 1e6 / GRID_US) + 1
    busy = np.zeros(n, bool)
    for s, e in spans:
        a, b = ((s - g0) / GRID_US, (e - g0) / GRID_US)
        busy[max(int(a), 0) : max(int(np.ceil(b)), 0)] = True
    owner = np.full(n, len(LABELS), np.int16)  # len(LABELS): outside every interval
    for label, s, e in host:
        i = LABELS.index(label)
        a, b = int((s - h0) * 1e6 / GRID_US), int(np.ceil((e - h0) * 1e6 / GRID_US))
        seg = owner[max(a, 0) : max(b, 0)]
        np.minimum(seg, i, out=seg)
    first = (spans[0][0] - g0) / GRID_US if spans else n  # the round's own kernels (markers excluded)
    last = (spans[-1][1] - g0) / GRID_US if spans else n
    idx = np.arange(n)
    idle = ~busy
    out = {"round_s": h1 - h0, "busy_s": busy.sum() * GRID_US / 1e6, "idle_s": idle.sum() * GRID_US / 1e6,
           "lead_s": (idle & (idx < first)).sum() * GRID_US / 1e6, "tail_s": (idle & (idx >= last)).sum() * GRID_US / 1e6,
           "drift_ms": ((h1 - h0) * 1e6 - (g1 - g0)) / 1e3}  # fmt: skip
    mid = idle & (idx >= first) & (idx < last)
    for i, label in enumerate(LABELS + ("outside turns",)):
        out[label + "_s"] = (mid & (owner == i)).sum() * GRID_US / 1e6
    return out


def profiled_round(engine, workload, inputs: list, sampling: dict, n: int, mode: str, stacks: bool = False) -> dict:
    import contextlib

    import torch
    from torch.profiler import ProfilerActivity, profile

    marker = torch.zeros(1, device="cuda")
    log = HostLog(engine)
    sampler = StackSampler(engine_thread_id()) if stacks else None
    try:
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof, (sampler or contextlib.nullcontext()):
            marker.add_(1)
            torch.cuda.synchronize()
            h0 = time.perf_counter()
            run_mode(engine, workload, inputs, mode, sampling, in_flight=n)
            h1 = time.perf_counter()
            marker.add_(1)
            torch.cuda.synchronize()
    finally:
        log.close()
    spans = kernel_spans(prof)
    g0, g1 = spans[0][1], spans[-1][0]  # the markers: the first ended as the host read h0, the second began after h1
    out = attribute(spans[1:-1], [s for s in log.spans if s[2] > h0 and s[1] < h1], h0, g0, h1, g1)
    if sampler is not None:
        out["idle_stacks"] = idle_stacks([s for s in sampler.samples if h0 <= s[0] <= h1], spans[1:-1], h0, g0)
    return out


def print_table(rows: dict) -> None:
    cols = ["round_s", "busy_s", "idle_s", "lead_s", "tail_s"] + [label + "_s" for label in LABELS] + ["outside turns_s"]
    print("| workload | " + " | ".join(c[:-2] + " ms" for c in cols) + " | drift ms |")
    print("| --- " * (len(cols) + 2) + "|")
    for name, r in rows.items():
        print(f"| {name} | " + " | ".join(f"{1000 * r[c]:.1f}" for c in cols) + f" | {r['drift_ms']:.2f} |", flush=True)


def main(argv=None) -> None:
    from workloads import BY_NAME

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_round_args(ap, device="cuda")
    ap.add_argument("--mode", default="graph", choices=("graph", "eager"))
    ap.add_argument("--stacks", action="store_true",
                    help="also sample the engine thread's stack (every 0.2 ms, in a second profiled round) and list "
                         "where it was while the GPU sat idle")
    args = ap.parse_args(argv)
    kw = engine_kwargs(args)
    sampling = {"max_new_tokens": args.max_new_tokens, "temperature": 0}
    rows: dict = {}
    with rf.Engine(args.config, **kw) as engine:
        for name in args.workloads.split(","):
            w = BY_NAME[name]
            inputs, _ = warm_up(engine, w, args.n, args.size, sampling, 0, args.min_round_s, ("graph", "eager"), None)
            rows[name] = profiled_round(engine, w, inputs, sampling, args.n, args.mode)
            print_table({name: rows[name]})
            if args.stacks:  # a round of its own: the sampler slows the engine thread
                rows[name]["idle_stacks"] = profiled_round(engine, w, inputs, sampling, args.n, args.mode, True)["idle_stacks"]
                for key, share in rows[name]["idle_stacks"]:
                    print(f"    {100 * share:5.1f}%  {key}")
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    print_table(rows)


if __name__ == "__main__":
    main()
