"""The meta_info a request graph returns: per request, and totals for the whole run."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from radixflow.runtime.scheduling.req import Req

if TYPE_CHECKING:
    from radixflow.runtime.programs.program_executor import ProgramRun


def metas(result: dict) -> list:
    """The meta_info of one op's result as a list (a gen with n > 1 has one per sample)."""
    meta = result["meta_info"]
    return meta if isinstance(meta, list) else [meta]


def request_meta(req: Req) -> dict:
    """meta_info of one request of a graph: its token counts and why it finished."""
    return {"prompt_tokens": len(req.origin_input_ids), "completion_tokens": len(req.output_ids),
            "cached_tokens": req.cached_tokens, "finish_reason": req.finish_reason}  # fmt: skip


def run_meta(run: "ProgramRun") -> dict:
    """meta_info of a whole request graph: totals over its requests."""
    return {
        "id": run.rid,
        "num_requests": len(run.reqs),
        "continued_segments": run.segments,
        "prompt_tokens": sum(len(r.origin_input_ids) for r in run.reqs),
        "cached_tokens": sum(r.cached_tokens for r in run.reqs),
        "completion_tokens": sum(m.get("completion_tokens", 0) for r in run.results.values() for m in metas(r)),
        "e2e_latency": time.time() - run.created,
    }
