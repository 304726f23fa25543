"""Timers around an Engine's scheduler steps, program executor and model forward passes
(engine thread only), for run.py and step_timeline.py. The model's own time is the GPU time of
the forward passes on CUDA (events around each, read at the end), the wall time inside them on
CPU; what is left of a round's wall time per pass is the host's share ("host ms / pass")."""

from __future__ import annotations

import time


# parts may nest: `advance` (a pass's read-back: tokens, stops, finished requests) holds the release of those
# it finishes; `launch` is the host's time inside a forward call (on CUDA before waiting for the pass)
PHASES = ("admission", "input_logprobs", "cache_unfinished", "release", "sample", "advance", "launch")


def phase_sites(sched) -> list:
    """(object, attribute, phase) of the scheduler's parts in PHASES other than `launch` (the forward call)."""
    from radixflow.runtime.scheduling import scheduler as scheduler_module

    return [(scheduler_module, "form_extend_batch", "admission"), (sched.logprobs, "add_inputs", "input_logprobs"),
            (sched.kv, "cache_unfinished", "cache_unfinished"), (sched.kv, "release", "release"),
            (sched, "sample", "sample"), (sched, "_advance", "advance")]  # fmt: skip


class Timeline:
    """Wraps the scheduler's step and the executor's on_step with timers (engine thread only).
    With `phases`, also the wall time of the scheduler's parts in PHASES (`phase_s`); on CUDA
    each forward pass is then waited for, so that no part's time includes the GPU's (this
    changes what overlaps: for attributing host time, not for the suite's figures)."""

    def __init__(self, engine, phases: bool = False):
        self.reset()
        sched, programs, runner = engine.scheduler, engine.programs, engine.runner
        self.cuda = str(runner.device).startswith("cuda")
        self._restore = [(sched, "step", sched.step), (programs, "on_step", programs.on_step),
                         (runner, "forward", runner.forward)]  # fmt: skip
        sched.step = self._timed(sched.step, "step_s", count=True)
        programs.on_step = self._timed(programs.on_step, "executor_s")
        runner.forward = self._gpu_timed(runner.forward, phases) if self.cuda else self._timed(runner.forward, "model_s")
        if phases:
            self._time_phases(sched)

    def _time_phases(self, sched) -> None:
        for obj, name, phase in phase_sites(sched):
            fn = getattr(obj, name)
            self._restore.append((obj, name, fn))
            setattr(obj, name, self._phase_timed(fn, phase))

    def _phase_timed(self, fn, phase: str):
        def wrapped(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.phase_s[phase] = self.phase_s.get(phase, 0.0) + time.perf_counter() - t

        return wrapped

    def _gpu_timed(self, fn, wait: bool = False):
        import torch

        def wrapped(*a, **k):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                end.record()
                self.events.append((start, end))
                if wait:
                    self.phase_s["launch"] = self.phase_s.get("launch", 0.0) + time.perf_counter() - t
                    end.synchronize()

        return wrapped

    def model_seconds(self) -> float:
        if self.cuda:
            if self.events:
                self.events[-1][1].synchronize()
            return sum(s.elapsed_time(e) for s, e in self.events) / 1000
        return self.model_s

    def _timed(self, fn, field: str, count: bool = False):
        def wrapped(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                setattr(self, field, getattr(self, field) + time.perf_counter() - t)
                self.steps += count

        return wrapped

    def reset(self) -> None:
        self.step_s = self.executor_s = self.model_s = 0.0
        self.steps = 0
        self.phase_s: dict = {}
        self.events: list = []

    def close(self) -> None:
        for obj, name, fn in self._restore:
            setattr(obj, name, fn)

    def __enter__(self) -> "Timeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def host_ms_per_pass(self, wall: float) -> float:
        return 1000 * (wall - self.model_seconds()) / max(self.steps, 1)


class GcPauses:
    """The cyclic garbage collector's pauses while open, in every thread: how many full
    (generation-2) collections ran and the seconds spent in all collections."""

    def __init__(self) -> None:
        self.full = 0
        self.seconds = 0.0
        self._start = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._start
        self.full += info["generation"] == 2

    def __enter__(self) -> "GcPauses":
        import gc

        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        import gc

        gc.callbacks.remove(self._callback)


def busy_union_s(intervals) -> float:
    """Seconds covered by the union of (start, end) intervals given in microseconds: the time
    the GPU had at least one kernel or copy running, overlapping ones counted once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total / 1e6


class KernelTime:
    """The GPU's own busy time while open: the union of its kernels' and copies' intervals,
    traced by torch.profiler (CUPTI). Unlike events around each forward pass, it leaves out the
    gaps inside a pass while the host launches its kernels one by one. `seconds` is None without
    CUDA."""

    def __init__(self, cuda: bool) -> None:
        self.cuda, self.seconds, self._prof = cuda, None, None

    def __enter__(self) -> "KernelTime":
        if self.cuda:
            from torch.profiler import ProfilerActivity, profile

            self._prof = profile(activities=[ProfilerActivity.CUDA])
            self._prof.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._prof is None:
            return
        import torch
        from torch.autograd import DeviceType

        torch.cuda.synchronize()
        self._prof.__exit__(*exc)
        spans = [(e.time_range.start, e.time_range.end) for e in self._prof.events() if e.device_type == DeviceType.CUDA]
        self.seconds = busy_union_s(spans)
