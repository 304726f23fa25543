"""Where the scheduler's host time goes, step by step (a CPU timeline for the GPU benchmarks).

Wraps the scheduler's per-step functions and sums each one's wall time per `Scheduler.step`:

    with HostTimeline() as tl:
        eng.generate(...)
    tl.summary()   # {"step": ms, "wait_gpu": ms, "advance": ms, "accept": ms, "jump": ms, "fill": ms, ...}

`wait_gpu` is the time `read_back` spends waiting for the pass it reads (the host is ahead of the
GPU: host work is off the critical path); `advance` the per-request work after a pass (of which
`accept`: grammars take the sampled tokens, which on llguidance includes the budget check after
each sampled token (the closing path followed, or searched): of it `follow`, the rows whose token
was not simply the path's next one, and of that `search`, closing-path searches (searches after
forced tokens count under `jump` too: `search` is not all under `accept`); `jump`: jump-forward, the check
after forced tokens, and a failed check's cut-back);
`fill` the grammar masks; `sample` the sampling launch (masks included); `launch` the forward
pass launch; `chained_ids` the next pass's input ids; `gc` Python's garbage collector;
`host_busy` = step - wait_gpu. Only the calls on the thread running `Scheduler.step` count: grammar
compiles on the compile pool's threads also search closing paths, off the step. With overlap scheduling, while the host is busy the GPU runs the
next forward pass, so the GPU idles once `host_busy` exceeds the forward pass. `summary()` adds
the 90th percentile and the sum over the run of `step` and `host_busy`, the steps that read no
decode pass back (the prefill's), and the run's time outside `Scheduler.step` (requests built and
checked, outputs collected).

Medians of parts do not add up to the median step (the parts peak in different steps: a step full
of mask work is not the step of a closing-path search), so `summary()` also gives each part's mean
per step (`mean`), which does add up: `mean["untimed"]` is the step's time in no part at all.
"""

from __future__ import annotations

import gc
import statistics
import threading
import time

from radixflow.constrained.closing_path import ClosingSearch
from radixflow.constrained.llguidance_grammars import LLGuidanceMatcher
from radixflow.runtime.scheduling import overlap, sampler, scheduler
from radixflow.runtime.scheduling.scheduler import Scheduler

# label: (owner, attribute) of a function called (at most nested) within Scheduler.step
PARTS = {
    "read_back": (Scheduler, "read_back"),
    "advance": (Scheduler, "_advance"),
    "accept": (scheduler, "accept_tokens"),
    "follow": (LLGuidanceMatcher, "_consumed"),
    "search": (ClosingSearch, "find"),
    "jump": (Scheduler, "_apply_jump_forward"),
    "fill": (sampler, "fill_bitmask_rows"),
    "sample": (overlap, "sample_flight"),
    "launch": (overlap, "launch_decode"),
    "chained_ids": (overlap, "chained_ids"),
    "poll_grammars": (scheduler, "poll_grammars"),
    "admit": (scheduler, "form_extend_batch"),
}
# the parts that together cover a step (the others are nested in these)
TOP_LEVEL = ("read_back", "sample", "launch", "chained_ids", "poll_grammars", "admit")


class HostTimeline:
    def __init__(self):
        self.steps: list = []  # per step: {label: seconds}
        self._now: dict = {}
        self._saved: list = []
        self._thread = None  # the thread running Scheduler.step

    def __enter__(self) -> "HostTimeline":
        for label, (owner, name) in PARTS.items():
            self._wrap(owner, name, label)
        self._wrap(Scheduler, "step", "step", last=True)
        gc.callbacks.append(self._gc)
        self._gc_start = 0.0
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.wall_s = time.perf_counter() - self._t0
        gc.callbacks.remove(self._gc)
        for owner, name, fn in reversed(self._saved):
            setattr(owner, name, fn)

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self._now["gc"] = self._now.get("gc", 0.0) + time.perf_counter() - self._gc_start

    def _wrap(self, owner, name: str, label: str, last: bool = False) -> None:
        fn = getattr(owner, name)
        self._saved.append((owner, name, fn))

        def timed(*args, **kw):
            if last:
                self._thread = threading.get_ident()
            elif threading.get_ident() != self._thread:
                return fn(*args, **kw)
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self._now[label] = self._now.get(label, 0.0) + time.perf_counter() - t
                if last:
                    self.steps.append(self._now)
                    self._now = {}

        setattr(owner, name, timed)

    def summary(self) -> dict:
        """Over the steps that read a decode pass back: the median ms per step of each part, p90 and
        sums of the step and host-busy times, and under `mean` the mean ms per step of each part
        (means add up: `untimed` is the step's mean less its timed top-level parts)."""
        steps = [s for s in self.steps if "read_back" in s]
        if not steps:
            return {}
        for s in steps:
            s["wait_gpu"] = s["read_back"] - s.get("advance", 0.0)
            s["host_busy"] = s["step"] - s["wait_gpu"]
        labels = ["step", "host_busy", "wait_gpu", *PARTS, "gc"]
        out = {k: round(1e3 * statistics.median(s.get(k, 0.0) for s in steps), 3) for k in labels}
        for k in ("step", "host_busy"):
            values = sorted(s[k] for s in steps)
            out[f"{k}_p90"] = round(1e3 * values[int(0.9 * (len(values) - 1))], 3)
            out[f"{k}_sum_s"] = round(sum(values), 4)
        mean = {k: round(1e3 * statistics.mean(s.get(k, 0.0) for s in steps), 3) for k in labels}
        mean["untimed"] = round(mean["step"] - sum(mean[k] for k in TOP_LEVEL), 3)
        out["mean"] = mean
        out["gc_sum_s"] = round(sum(s.get("gc", 0.0) for s in self.steps), 4)
        out["steps"] = len(steps)
        out["other_steps_s"] = round(sum(s["step"] for s in self.steps if "read_back" not in s), 4)
        out["outside_steps_s"] = round(self.wall_s - sum(s["step"] for s in self.steps), 4)
        return out
