"""Where the scheduler's host time goes, step by step (a CPU timeline for the GPU benchmarks).

Wraps the scheduler's per-step functions and sums each one's wall time per `Scheduler.step`:

    with HostTimeline() as tl:
        eng.generate(...)
    tl.medians()   # {"step": ms, "wait_gpu": ms, "advance": ms, "accept": ms, "jump": ms, "fill": ms, ...}

`wait_gpu` is the time `read_back` spends waiting for the pass it reads (the host is ahead of the
GPU: host work is off the critical path); `advance` the per-request work after a pass (of which
`accept`: grammars take the sampled tokens, `jump`: jump-forward and llguidance's budget check);
`fill` the grammar masks; `sample` the sampling launch (masks included); `launch` the forward
pass launch; `host_busy` = step - wait_gpu. With overlap scheduling, while the host is busy the
GPU runs the next forward pass, so the GPU idles once `host_busy` exceeds the forward pass.
"""

from __future__ import annotations

import statistics
import time

from radixflow.runtime.scheduling import overlap, sampler, scheduler
from radixflow.runtime.scheduling.scheduler import Scheduler

# label: (owner, attribute) of a function called (at most nested) within Scheduler.step
PARTS = {
    "read_back": (Scheduler, "read_back"),
    "advance": (Scheduler, "_advance"),
    "accept": (scheduler, "accept_tokens"),
    "jump": (Scheduler, "_apply_jump_forward"),
    "fill": (sampler, "fill_bitmask_rows"),
    "sample": (overlap, "sample_flight"),
    "launch": (overlap, "launch_decode"),
}


class HostTimeline:
    def __init__(self):
        self.steps: list = []  # per step: {label: seconds}
        self._now: dict = {}
        self._saved: list = []

    def __enter__(self) -> "HostTimeline":
        for label, (owner, name) in PARTS.items():
            self._wrap(owner, name, label)
        self._wrap(Scheduler, "step", "step", last=True)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, fn in reversed(self._saved):
            setattr(owner, name, fn)

    def _wrap(self, owner, name: str, label: str, last: bool = False) -> None:
        fn = getattr(owner, name)
        self._saved.append((owner, name, fn))

        def timed(*args, **kw):
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self._now[label] = self._now.get(label, 0.0) + time.perf_counter() - t
                if last:
                    self.steps.append(self._now)
                    self._now = {}

        setattr(owner, name, timed)

    def medians(self) -> dict:
        """Median ms per step of each part, over the steps that read a decode pass back."""
        steps = [s for s in self.steps if "read_back" in s]
        if not steps:
            return {}
        for s in steps:
            s["wait_gpu"] = s["read_back"] - s.get("advance", 0.0)
            s["host_busy"] = s["step"] - s["wait_gpu"]
        labels = ["step", "host_busy", "wait_gpu", *PARTS]
        out = {k: round(1e3 * statistics.median(s.get(k, 0.0) for s in steps), 3) for k in labels}
        out["steps"] = len(steps)
        return out
