"""SGLang's `POST /start_profile` and `POST /stop_profile`: torch.profiler around the scheduler's steps, written as
a Chrome trace (chrome://tracing, Perfetto) when the profile stops. The request is checked in the HTTP process
(`parse_profile`, torch-free); the scheduler process runs the profiler (`StepProfiler`). Under tensor parallelism
only rank 0's scheduler is profiled."""

from __future__ import annotations

import itertools
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Optional

from radixflow.errors import RadixflowError

PROFILE_FIELDS = ("output_dir", "num_steps", "activities", "record_shapes", "with_stack")  # SGLang's names
ACTIVITIES = ("CPU", "GPU")


@dataclass(frozen=True)
class ProfileRequest:
    output_dir: str
    num_steps: Optional[int] = None  # stop by itself after this many scheduler steps
    activities: tuple = ACTIVITIES
    record_shapes: bool = False
    with_stack: bool = False


def parse_profile(body: Any) -> ProfileRequest:
    """A /start_profile body (empty or null: the defaults) as a ProfileRequest; RadixflowError says what to change."""
    body = {} if body is None else body
    if not isinstance(body, dict):
        raise RadixflowError("the /start_profile body must be a JSON object (or empty)")
    unknown = sorted(set(body) - set(PROFILE_FIELDS))
    if unknown:
        raise RadixflowError(f"unknown field(s) for /start_profile: {', '.join(unknown)}; accepted: {', '.join(PROFILE_FIELDS)}")
    out = body.get("output_dir") or os.environ.get("SGLANG_TORCH_PROFILER_DIR") or tempfile.gettempdir()
    steps = body.get("num_steps")
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise RadixflowError(f"num_steps must be a positive integer or null, got {steps!r}")
    activities = body.get("activities") or list(ACTIVITIES)
    if not isinstance(activities, list) or not set(activities) <= set(ACTIVITIES):
        raise RadixflowError(f"activities must be a list of {' and '.join(ACTIVITIES)}, got {activities!r}")
    flags = {k: body.get(k) or False for k in ("record_shapes", "with_stack")}
    if any(not isinstance(v, bool) for v in flags.values()):
        raise RadixflowError("record_shapes and with_stack must be true or false")
    return ProfileRequest(str(out), steps, tuple(activities), **flags)


class StepProfiler:
    """One profile at a time in the scheduler process: `start`, `on_step` after each scheduler step, `stop`."""

    def __init__(self) -> None:
        self.prof = None
        self.steps_left: Optional[int] = None
        self.path = ""
        self.numbers = itertools.count(1)
        self.last_path = ""  # the trace of the last profile that stopped by itself (num_steps), until a stop

    def start(self, req: ProfileRequest) -> dict:
        import torch

        if self.prof is not None:
            return {"error": "a profile is already running: POST /stop_profile first"}
        try:  # the request's folder may not be writable: its error, not the scheduler's
            os.makedirs(req.output_dir, exist_ok=True)
            if not os.access(req.output_dir, os.W_OK):
                raise PermissionError(f"{req.output_dir} is not writable")
        except OSError as e:
            return {"error": f"output_dir {req.output_dir!r} cannot hold the trace ({e}); give another"}
        kinds = {"CPU": torch.profiler.ProfilerActivity.CPU, "GPU": torch.profiler.ProfilerActivity.CUDA}
        wanted = [kinds[a] for a in req.activities if a == "CPU" or torch.cuda.is_available()]
        self.prof = torch.profiler.profile(activities=wanted, record_shapes=req.record_shapes, with_stack=req.with_stack)
        self.prof.start()
        self.steps_left = req.num_steps
        # numbered: two profiles within one second had one name, and the second trace overwrote the first
        name = f"radixflow-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(self.numbers)}.trace.json"
        self.path = os.path.join(req.output_dir, name)
        return {"path": self.path}

    def on_step(self) -> None:
        if self.prof is not None and self.steps_left is not None:
            self.steps_left -= 1
            if self.steps_left <= 0:
                try:
                    self.last_path = self._write()
                except OSError:
                    self.last_path = f"{self.path}, which could not be written"

    def stop(self) -> dict:
        if self.prof is None:
            ended = f" (the last one stopped after its num_steps: {self.last_path})" if self.last_path else ""
            return {"error": f"no profile is running{ended}; POST /start_profile first"}
        self.last_path = ""
        try:
            return {"path": self._write()}
        except OSError as e:
            return {"error": f"the trace could not be written to {self.path} ({e})"}

    def _write(self) -> str:
        prof, self.prof = self.prof, None
        prof.stop()
        prof.export_chrome_trace(self.path)  # a full disk raises here, after the profiler was stopped and let go
        return self.path
