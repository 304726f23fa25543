"""Overlapped extend passes read their input logprobs back a step late (extend_overlap.py): the host
does not wait for a select's scoring pass before building the next one. Outputs, logprobs and choices
must be those of the synchronous path; prompt-only requests finish only when their logprobs are in.

The shared engine runs on CPU, where overlap is off by default; these tests switch it on.
"""

from __future__ import annotations

from types import SimpleNamespace

from conftest import PROMPTS
from test_overlap_schedule import _settle, overlap_on

from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.scheduling.req import Req

SELECTS = [
    {"ops": [{"op": "text", "text": f"Q: Is the sky blue ({i})?\nA:"},
             {"op": "select", "id": 1, "name": "s", "choices": [" yes", " no", " maybe so"], "method": method}]}  # fmt: skip
    for i, method in enumerate(["token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized"])
]


def _logprob_outputs(engine, max_new: list, top: int | list = 0) -> list:
    params = [{"max_new_tokens": m, "temperature": 0, "ignore_eos": True} for m in max_new]
    outs = engine.generate(PROMPTS[: len(max_new)], params, return_logprob=True, logprob_start_len=0, top_logprobs_num=top)
    return [(o["output_ids"], o["meta_info"]["finish_reason"], o["meta_info"]["input_token_logprobs"],
             o["meta_info"]["output_token_logprobs"], o["meta_info"].get("input_top_logprobs")) for o in outs]  # fmt: skip


def _close(a: list, b: list) -> bool:
    """Logprob triples [lp, id, text] equal up to float noise (the same rows, other batch shapes)."""
    return len(a) == len(b) and all(
        x[1:] == y[1:] and (x[0] is None) == (y[0] is None) and (x[0] is None or abs(x[0] - y[0]) < 1e-4) for x, y in zip(a, b)
    )


def _floats(values: list) -> list:
    """A select's meta values flattened: per-choice floats, or per-choice lists of them."""
    return [x for v in values for x in (v if isinstance(v, list) else [v])]


def test_prompt_logprobs_overlap_with_the_same_outputs(engine):
    """Prompt-only requests (max_new_tokens 0) and generating ones, chunked: the same tokens, finish reasons
    and logprobs as without overlap, and at least one pass's logprobs were read back late."""
    max_new = [0, 3, 0, 5]
    ref = _logprob_outputs(engine, max_new)
    with overlap_on(engine, cold_chunk=16) as sched:
        got = _logprob_outputs(engine, max_new)
        _settle(sched)
    _same(got, ref)


def _same(got: list, ref: list) -> None:
    for (ids, reason, inputs, outputs, _), (rids, rreason, rinputs, routputs, _) in zip(got, ref):
        assert ids == rids and reason == rreason
        assert _close(inputs, rinputs) and _close(outputs, routputs)
        assert inputs[0][0] is None and all(lp[0] is not None for lp in inputs[1:])


def test_top_logprob_rows_keep_every_requests_chunks_in_order(engine):
    """Top logprobs are read at once; a pass holding them must not apply another request's chunk before that
    request's earlier chunk, still pending: every request's logprobs (and top rows) as without overlap."""
    max_new, top = [0, 2, 0, 3], [0, 3, 0, 2]
    ref = _logprob_outputs(engine, max_new, top)
    with overlap_on(engine, cold_chunk=8) as sched:
        got = _logprob_outputs(engine, max_new, top)
        _settle(sched)
    _same(got, ref)
    for g, r in zip(got, ref):
        assert (g[4] is None) == (r[4] is None)
        if g[4] is not None:
            assert [[t[1] for t in row] if row else row for row in g[4]] == [[t[1] for t in row] if row else row for row in r[4]]


def _step_to_pending_prompt_only(engine, sched) -> Req:
    """Add a prompt-only request with prompt logprobs and step (a 4-token chunk a step) until its last chunk's
    pass is pending: then it is retired, but not finished."""
    ids = engine.tokenizer.encode(PROMPTS[1])
    req = Req(rid="p0", origin_input_ids=ids, sampling=SamplingParams(max_new_tokens=0))
    req.logprob.return_logprob, req.logprob.logprob_start_len = True, 0
    engine.stepper.exclusive(lambda: sched.add_request(req))
    for _ in range(len(ids)):  # each chunk's logprobs read back by the next step
        engine.stepper.exclusive(sched.step)
        pending = sched.pending_extend
        assert pending is not None and pending.reqs == [] and not req.finished
        if pending.prompt_only:
            break
    assert pending.prompt_only == [req] and req.req_pool_idx is None, "retired with its last chunk"
    return req


def test_a_prompt_only_request_finishes_when_its_logprobs_are_read_back(engine):
    """Its KV goes into the tree with its pass, but it is not finished (nothing reads it) until the next
    step reads the pass back; then it holds every prompt position's logprob."""
    sched = engine.scheduler
    with overlap_on(engine, cold_chunk=4, decodes=False):
        req = _step_to_pending_prompt_only(engine, sched)
        assert len(req.input_token_logprobs) < len(req.origin_input_ids) and sched.has_work()
        engine.stepper.exclusive(sched.step)
        assert req.finished and req.finish_reason == {"type": "length", "length": 0}
        assert len(req.input_token_logprobs) == len(req.origin_input_ids) and sched.pending_extend is None
        _settle(sched)


def test_a_failed_step_fails_a_pending_prompt_only_request(engine):
    """The server's failed-step path (SchedulerLoop._fail_batch) fails a retired request that has not finished
    with an error output, instead of reporting it unfinished; the pending pass is still read back, and no page leaks."""
    from radixflow.runtime.server.scheduler_process import SchedulerLoop

    sched = engine.scheduler
    with overlap_on(engine, cold_chunk=4, decodes=False):
        req = _step_to_pending_prompt_only(engine, sched)
        loop = SimpleNamespace(scheduler=sched, inflight={req.rid: req})
        loop._fail = lambda r, e: SchedulerLoop._fail(loop, r, e)
        outs = engine.stepper.exclusive(lambda: SchedulerLoop._fail_batch(loop, RuntimeError("boom")))
        assert len(outs) == 1 and outs[0].finished and "boom" in outs[0].error
        engine.stepper.exclusive(sched.step)
        assert req.finish_reason["type"] == "abort" and sched.pending_extend is None
        _settle(sched)


def test_selects_overlap_with_the_same_choices_and_logprobs(engine):
    """A select's scoring requests (each scoring method) run in overlapped passes: the same choice and
    the same normalized logprobs."""
    ref = engine.run_program(SELECTS)
    with overlap_on(engine, cold_chunk=8, decodes=False) as sched:  # selects run no decode pass
        late = sched.stats.late_extend_read_backs
        got = engine.run_program(SELECTS)
        assert sched.stats.late_extend_read_backs > late, "no scoring pass was read back late"
        _settle(sched)
    for g, r in zip(got, ref):
        assert g["results"]["1"]["text"] == r["results"]["1"]["text"]
        gm, rm = g["results"]["1"]["meta_info"], r["results"]["1"]["meta_info"]
        assert gm.keys() == rm.keys()
        for key in gm:
            a, b = _floats(gm[key]), _floats(rm[key])
            assert len(a) == len(b) and all(abs(x - y) < 1e-4 for x, y in zip(a, b)), key
    assert "unconditional_token_logprobs" in got[2]["results"]["1"]["meta_info"]
