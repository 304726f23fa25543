"""Profiles of batch-1 decode: a bare graph replay, and GPU work outside the graph between engine steps."""

from __future__ import annotations

import json
import os
import statistics

import torch

from gpubench.common import OPTS, greedy, sync


def profile_replay(runner, steps: int = 20) -> list:
    """Per-kernel GPU time of bare batch-1 replays, also written to OUT/<section>_profile.txt. With PDL on (the
    default) a kernel's recorded time includes waiting for its predecessor, so the times overlap and their sum
    exceeds the replay."""
    from torch.profiler import ProfilerActivity, profile

    g = runner.graph_runner.graphs[1]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            g.replay()
        torch.cuda.synchronize()
    events = prof.key_averages()
    rows = sorted(events, key=lambda e: -getattr(e, "device_time_total", 0))
    key = getattr(OPTS, "section_key", "decode_bs1")  # one file per section run: bs1 and bs1@fp8 both profile
    with open(os.path.join(OPTS.out, f"{key.replace('@', '_').replace('#', '_')}_profile.txt"), "w") as f:
        for e in rows:
            f.write(f"{getattr(e, 'device_time_total', 0) / steps:10.1f} us/step  {e.count // steps:5d}/step  {e.key}\n")
    return [(e.key[:60], round(getattr(e, "device_time_total", 0) / steps, 1), e.count // steps) for e in rows[:10]]


def gemv_only_ms(runner) -> float:
    """GPU ms of one batch-1 decode step's matmuls alone: every linear layer through its own path (the GEMV and
    its chosen config where chosen, PDL as the settings say) and the output head, back to back in a CUDA graph.
    No decode step beats this without faster GEMVs; the step's other kernels come on top (NaN off CUDA)."""
    from radixflow.kernels.gemv import capture_graph, replay_us
    from radixflow.runtime.execution.layers.parallel_linear import ColumnParallelLinear, RowParallelLinear

    model = runner.model
    linears = [m for m in model.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    dtype = next(p.dtype for p in model.parameters() if p.dtype in (torch.bfloat16, torch.float16, torch.float32))
    device = next(model.parameters()).device
    widths = {m.weight.shape[1] for m in linears} | {model.shape.hidden}
    inputs = {k: torch.randn(1, k, device=device).to(dtype) for k in widths}

    def step(_: int) -> None:
        for m in linears:
            m(inputs[m.weight.shape[1]])
        model.compute_logits(inputs[model.shape.hidden])

    if device.type != "cuda":  # the smoke run: the plumbing only
        step(0)
        return float("nan")
    return min(replay_us(capture_graph(step, 1), 1, reps=20) for _ in range(3)) / 1e3


def _trace_gpu_ops(prof) -> tuple[list, set]:
    """(GPU kernels / memcpys / memsets as (name, start_us, end_us, correlation) by start time,
    correlation ids of the CUDA graph launches) from a profile's chrome trace."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        prof.export_chrome_trace(os.path.join(d, "t.json"))
        with open(os.path.join(d, "t.json")) as f:
            events = json.load(f)["traceEvents"]
    ops = [(e["name"], e["ts"], e["ts"] + e.get("dur", 0), e.get("args", {}).get("correlation"))
           for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    launches = {e.get("args", {}).get("correlation") for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "GraphLaunch" in e.get("name", "")}
    return sorted(ops, key=lambda o: o[1]), launches - {None}


def _busy_us(intervals: list, lo: float, hi: float) -> float:
    """Length of the union of intervals, clipped to [lo, hi]."""
    total, end = 0.0, lo
    for s, e in sorted(intervals):
        s, e = max(s, end), min(e, hi)
        if e > s:
            total, end = total + e - s, e
    return total


def _outside_graph_stats(ops: list, launches: set, graph_names: set, top: int = 15) -> dict:
    """Split a batch-1 decode trace into graph replays and the GPU work outside them. An op is
    inside a replay when its correlation id is a graph launch's (CUPTI gives a graph's kernels
    the id of their cudaGraphLaunch); failing that, when its name occurs in a bare replay, a run
    of consecutive such ops being one replay."""
    groups: dict = {}
    for o in ops:
        if o[3] in launches:
            groups.setdefault(o[3], []).append(o)
    by_corr = len(groups) >= 2
    if by_corr:
        inside = lambda o: o[3] in launches  # noqa: E731
        runs = list(groups.values())
    else:
        inside = lambda o: o[0] in graph_names  # noqa: E731
        runs, run = [], []
        for o in ops:  # an outside op ends a replay unless it overlaps it (another stream)
            if inside(o):
                run.append(o)
            elif run and o[1] >= max(x[2] for x in run):
                runs, run = runs + [run], []
        runs += [run] if run else []
    replays = sorted((min(o[1] for o in r), max(o[2] for o in r), len(r)) for r in runs)
    if len(replays) < 2:
        raise RuntimeError(f"{len(replays)} graph replays in the trace")
    lo, hi, steps = replays[0][0], replays[-1][1], len(replays) - 1
    outside = [o for o in ops if not inside(o) and lo <= o[1] <= hi]
    gaps = [(e0, s1) for (_, e0, _), (s1, _, _) in zip(replays, replays[1:])]
    idle = [s1 - e0 - _busy_us([o[1:3] for o in outside], e0, s1) for e0, s1 in gaps]
    by_name: dict = {}
    for o in outside:
        n, t = by_name.get(o[0], (0, 0.0))
        by_name[o[0]] = (n + 1, t + o[2] - o[1])
    rows = sorted(by_name.items(), key=lambda kv: -kv[1][1])
    med = statistics.median
    return {"method": "graph-launch correlation" if by_corr else "kernel names of a bare replay", "replays": len(replays),
            "ops_per_replay": med(r[2] for r in replays), "replay_us": med(e - s for s, e, _ in replays),
            "step_us": med(b[0] - a[0] for a, b in zip(replays, replays[1:])),
            "gap_us": med(s1 - e0 for e0, s1 in gaps), "idle_us": med(idle), "idle_fraction": sum(idle) / (hi - lo),
            "outside_ops_per_step": len(outside) / steps, "outside_us_per_step": sum(t for _, (_, t) in rows) / steps,
            "outside_names_also_in_graph": sorted(n for n in by_name if n in graph_names)[:5],
            "outside_top": [(n[:80], round(c / steps, 2), round(t / steps, 2)) for n, (c, t) in rows[:top]]}


def profile_outside_graph(eng, prompt: list, steps: int = 30) -> dict:
    """torch.profiler over ~steps end-to-end decode steps at batch 1 (Engine.generate, overlap as
    configured): what the GPU runs outside the batch-1 graph, and how long it waits. step_us is
    the end-to-end step on the GPU (one replay's start to the next's)."""
    from torch.profiler import ProfilerActivity, profile

    g = eng.runner.graph_runner.graphs[1]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # a bare replay: the graph's kernels
        for _ in range(3):
            g.replay()
        sync()
    bare, _ = _trace_gpu_ops(prof)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # CUDA only (runtime calls included): less host overhead
        eng.generate(input_ids=[prompt], sampling_params=greedy(steps + 2))
        sync()
    out = _outside_graph_stats(*_trace_gpu_ops(prof), {o[0] for o in bare})
    out.update(ops_per_bare_replay=len(bare) / 3, overlap=eng.scheduler.overlap)
    return out
