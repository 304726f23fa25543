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
    """meta_info of one request of a graph (a sample of a gen with n > 1): its token counts and why it finished."""
    return {**segment_tokens(req), "cached_tokens": req.cached_tokens, "finish_reason": req.finish_reason,
            **request_facts(req)}  # fmt: skip


def segment_tokens(req: Req) -> dict:
    """A gen's token counts: its prompt (a continued gen's holds the segments before its own) and its outputs."""
    return {"prompt_tokens": len(req.origin_input_ids) + req.segment_start,
            "completion_tokens": len(req.output_ids) - req.segment_start}


def request_facts(req: Req) -> dict:
    """The rest of the meta_info eager mode's gens have (/generate's): the request's id (a continued gen's is the
    request it continues), its retractions, the seconds since it started, and the tokens a grammar jumped over, if
    any; all but the id counted from the gen's segment."""
    retractions = req.num_retractions - req.segment_retractions
    facts = {"id": req.rid, "num_retractions": retractions, "e2e_latency": time.time() - req.created}
    if req.jump_forward_tokens:
        facts["jump_forward_tokens"] = req.jump_forward_tokens
    return facts


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
