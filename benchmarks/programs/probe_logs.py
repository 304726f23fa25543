"""What graph_eager_probe.py records around an Engine: every forward pass (PassLog), the host's synchronizations
with the GPU (SyncLog), the pinned host allocator's counters and the scheduler's counters."""

from __future__ import annotations

import collections
import os
import time
import traceback
import warnings
from typing import Optional

import torch

from radixflow.runtime.execution.forward_batch import ForwardMode

HERE = ("probe_logs.py", "graph_eager_probe.py", "probe_passes.py")


class PassLog:
    """Every forward pass of the engine while open: kind, shape, bucket, whether its bucket's graph ran for the
    first time in this engine, host ms inside the call and since the previous call, GPU ms (events, read by
    `resolve` after the round)."""

    def __init__(self, engine, seen: set):
        self.runner, self.seen = engine.runner, seen  # `seen`: buckets replayed in this engine so far
        self.cuda = str(self.runner.device).startswith("cuda")
        self.passes: list = []
        self._bucket: Optional[tuple] = None
        self._last_end: Optional[float] = None
        self._forward = self.runner.forward
        self.runner.forward = self.forward
        self.graphs = self.runner.extend_graphs
        if self.graphs is not None:
            self._replay = self.graphs.replay
            self.graphs.replay = self.replay

    def replay(self, fb, bucket):
        self._bucket = (tuple(bucket), bucket not in self.seen)
        self.seen.add(bucket)
        return self._replay(fb, bucket)

    def forward(self, fb):
        self._bucket = None
        events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if self.cuda else None
        t = time.perf_counter()
        if events:
            events[0].record()
        out = self._forward(fb)
        if events:
            events[1].record()
        end = time.perf_counter()
        self.passes.append({
            "kind": pass_kind(fb, self._bucket is not None), "tokens": fb.num_tokens,
            "reqs": fb.batch_size, "logits": fb.logits_indices.numel(), "rows_of_one": ones(fb),
            "bucket": self._bucket[0] if self._bucket else None, "first_replay": bool(self._bucket and self._bucket[1]),
            "call_ms": 1000 * (end - t), "gap_ms": None if self._last_end is None else 1000 * (t - self._last_end),
            "events": events, "wall_s": end - t, "start": t, "end": end,
        })  # fmt: skip
        self._last_end = end
        return out

    def take(self) -> list:
        """The passes so far with their GPU ms (waits for the last), and a fresh log."""
        out, self.passes, self._last_end = self.passes, [], None
        if out and out[-1]["events"]:
            out[-1]["events"][1].synchronize()
        for p in out:
            ev = p.pop("events")
            p["gpu_ms"] = ev[0].elapsed_time(ev[1]) if ev else 1000 * p["wall_s"]
            p.pop("wall_s")
        return out

    def close(self) -> None:
        self.runner.forward = self._forward
        if self.graphs is not None:
            self.graphs.replay = self._replay


def pass_kind(fb, bucketed: bool) -> str:
    """decode; extend (every row has several new tokens, or one row), or mixed (an extend pass with decode rows of
    one new token beside rows of several: a request graph's continuation, or jump-forward tokens, in a decode step);
    then _graph (in an extend graph's bucket) or _eager."""
    if fb.mode == ForwardMode.DECODE:
        return "decode"
    single = ones(fb)
    kind = "mixed" if 0 < single < fb.batch_size else "extend"
    return f"{kind}_{'graph' if bucketed else 'eager'}"


def ones(fb) -> int:
    """An extend pass's rows with one new token (decode rows that ride in it), 0 for a decode pass."""
    return 0 if fb.mode == ForwardMode.DECODE else sum(1 for e in fb.extend_lens_list if e == 1)


def radixflow_site(stack) -> str:
    """The innermost radixflow frame of `stack` (file:line function), else the innermost frame not in warnings."""
    frames = [f for f in stack if os.path.basename(f.filename) not in HERE and "warnings" not in f.filename]
    ours = [f for f in frames if f"{os.sep}radixflow{os.sep}" in f.filename]
    f = (ours or frames or stack)[-1]
    parts = f.filename.split(os.sep)
    short = os.sep.join(parts[parts.index("radixflow"):]) if "radixflow" in parts else parts[-1]
    return f"{short}:{f.lineno} {f.name}"


class SyncLog:
    """While open: synchronizing CUDA calls (set_sync_debug_mode warnings) and waits on CUDA events not yet
    complete (Event.synchronize), by the radixflow line that made them, with the ms waited on events."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.syncs: collections.Counter = collections.Counter()
        self.waits: collections.Counter = collections.Counter()
        self.wait_ms: collections.Counter = collections.Counter()

    def _show(self, message, category, filename, lineno, file=None, line=None):
        if "synchronizing CUDA operation" in str(message):
            self.syncs[radixflow_site(traceback.extract_stack())] += 1
        else:
            self._showwarning(message, category, filename, lineno, file, line)

    def _event_sync(self, event):
        if event.query():
            return
        t = time.perf_counter()
        self._synchronize(event)
        site = radixflow_site(traceback.extract_stack())
        self.waits[site] += 1
        self.wait_ms[site] += 1000 * (time.perf_counter() - t)

    def __enter__(self) -> "SyncLog":
        if self.cuda:
            self._filters, self._showwarning = list(warnings.filters), warnings.showwarning
            warnings.simplefilter("always")
            warnings.showwarning = self._show
            self._synchronize = torch.cuda.Event.synchronize
            torch.cuda.Event.synchronize = lambda ev: self._event_sync(ev)
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.Event.synchronize = self._synchronize
            warnings.filters[:] = self._filters
            warnings.showwarning = self._showwarning

    def summary(self) -> dict:
        return {"syncs": dict(self.syncs), "event_waits": dict(self.waits),
                "event_wait_ms": {k: round(v, 3) for k, v in self.wait_ms.items()}}  # fmt: skip


def host_alloc_stats() -> dict:
    """The pinned host allocator's counters, where this torch has them (else {})."""
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if stats is None or not torch.cuda.is_available():
        return {}
    try:
        flat = stats()
    except Exception:  # a torch without the host allocator's stats, or one that cannot read them: not this probe's question
        return {}
    return {k: v for k, v in flat.items() if isinstance(v, (int, float)) and "alloc" in k}




def scheduler_counters(engine) -> dict:
    """The scheduler's counters (SchedulerStats' integer fields): a round's are the difference of two reads."""
    return {k: v for k, v in vars(engine.scheduler.stats).items() if isinstance(v, int)}
