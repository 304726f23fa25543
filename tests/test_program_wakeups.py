"""The program executor looks only at runs that something woke (program_runs.py): each way a
program's request finishes, and each way a run fails, must wake it, or the program waits forever.
Each program runs on a thread joined with a time-out, so a run never woken fails the test."""

from __future__ import annotations

import pickle
import threading

import pytest

from radixflow.runtime.programs.program_runs import GEN
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.scheduling.req import Req

GREEDY = {"temperature": 0}
TIMEOUT_S = 120


def _gen(i: int, **sp) -> dict:
    return {"op": "gen", "id": i, "name": f"g{i}", "sampling_params": {**GREEDY, **sp}}


def _run(engine, program) -> dict:
    """engine.run_program(program) on a thread (its result, or its error raised here)."""
    out: list = []

    def run() -> None:
        try:
            out.append(engine.run_program(program))
        except Exception as e:
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(TIMEOUT_S)
    assert out, "the program never finished: a run that was never woken"
    if isinstance(out[0], Exception):
        raise out[0]
    return out[0]


def _running_gen(engine, name: str):
    """The program's strand once its gen `name` has a request in the scheduler (from the engine thread)."""
    def find():
        return next((st for run in engine.programs.runs for st in run.strands
                     if st.state == GEN and st.ops[st.pc].name == name), None)  # fmt: skip

    found: list = []
    engine.stepper.run_until(lambda: bool(found.append(find()) or found[-1] is not None))
    return found[-1]


def test_a_finish_calls_the_hook_once_per_finish_and_pickles_without_it():
    seen = []
    req = Req("r", [1, 2], SamplingParams(max_new_tokens=1), on_finish=seen.append)
    req.finish({"type": "length", "length": 1})
    req.finish({"type": "abort"})  # a second finish changes nothing
    assert seen == [req] and req.finish_reason["type"] == "length"
    req.finish_reason = None  # a request graph's next segment (request_segments.start_segment)
    req.finish({"type": "stop", "matched": None})
    assert seen == [req, req]
    copy = pickle.loads(pickle.dumps(req))  # the replicated-TP step stream pickles new requests
    assert copy.on_finish is None and copy.waiting_match is None and copy.finish_reason == req.finish_reason


def test_on_step_looks_only_at_runs_something_woke(engine, monkeypatch):
    """A run whose one gen decodes for 40 steps is looked at when it starts and when that request
    finishes, not after each of the steps in between (before: every strand of every run, every step)."""
    ex = engine.programs
    looked: list = []
    poll = ex._poll
    monkeypatch.setattr(ex, "_poll", lambda st: looked.append(st.run.rid) or poll(st))
    before = engine.stepper.steps
    program = {"rid": "long", "ops": [{"op": "text", "text": "Count: 1, 2,"}, _gen(1, max_new_tokens=40, ignore_eos=True)]}
    out = _run(engine, program)
    assert out["results"]["1"]["meta_info"]["completion_tokens"] == 40
    assert engine.stepper.steps - before >= 40
    assert looked.count("long") <= 4, looked.count("long")


def test_a_program_ends_whichever_way_its_requests_finish(engine):
    """Length, a stop string, EOS or length on a free gen, a regex gen (its grammar ends it), a select's
    scoring requests (max_new_tokens 0: done after the prefill), n > 1 samples and fork branches."""
    fork = {"op": "fork", "id": 7, "branches": [[{"op": "text", "text": " A:"}, _gen(8, max_new_tokens=2)],
                                                [{"op": "text", "text": " B:"}, _gen(9, max_new_tokens=3)]]}  # fmt: skip
    program = {"ops": [
        {"op": "text", "text": "Count: 1, 2,"}, _gen(1, max_new_tokens=3, ignore_eos=True),
        _gen(2, max_new_tokens=12, stop=","),
        {"op": "text", "text": "\nAnswer yes or no:"},
        {"op": "select", "id": 3, "name": "s", "choices": [" yes", " no"], "method": "token_length_normalized"},
        {"op": "text", "text": "\nA number:"}, _gen(4, max_new_tokens=8, regex="[0-9]{2}"),
        _gen(5, max_new_tokens=2, n=2, temperature=1.0), _gen(6, max_new_tokens=30),
        fork, {"op": "join", "fork": 7, "mode": "concat"},
    ]}  # fmt: skip
    out = _run(engine, program)
    assert out["error"] is None, out["error"]
    res = out["results"]
    assert res["1"]["meta_info"]["finish_reason"]["type"] == "length"
    assert res["3"]["text"] in (" yes", " no") and len(res["4"]["text"]) == 2 and len(res["5"]["text"]) == 2
    assert {"8", "9"} <= set(res)


def test_an_abort_of_a_program_or_of_one_of_its_requests_ends_the_program(engine):
    long = {"max_new_tokens": 400, "ignore_eos": True}
    for how in ("program", "request"):
        rid = f"abort-{how}"
        out: list = []
        t = threading.Thread(target=lambda: out.append(engine.run_program(
            {"rid": rid, "ops": [{"op": "text", "text": "Count: 1, 2,"}, _gen(1, **long)]})), daemon=True)  # fmt: skip
        t.start()
        st = _running_gen(engine, "g1")
        if how == "program":  # an HTTP abort of the program: the run fails, then on_step ends it
            engine.stepper.exclusive(lambda: engine.programs.abort(rid))
        else:  # an abort of the request alone: its finish wakes the run
            engine.stepper.exclusive(lambda: engine.scheduler.abort(st.req.rid))
        t.join(TIMEOUT_S)
        assert out, f"the program never finished after the {how} abort"
        assert "aborted" in out[0]["error"] and out[0]["results"] == {}
        assert len(st.req.output_ids) < 400, "the run ended only when its request did"


def test_a_failed_grammar_ends_its_program(engine, monkeypatch):
    """A grammar that fails to compile finishes its request from the scheduler's grammar queue."""
    from radixflow.runtime.scheduling.grammar_wait import start_grammar_backend

    backend = engine.stepper.exclusive(lambda: start_grammar_backend(engine.scheduler))
    monkeypatch.setattr(backend, "poll", lambda req: backend._reject(req, "the grammar failed (test)"))
    program = {"ops": [{"op": "text", "text": "A number:"}, _gen(1, max_new_tokens=4, regex="[0-9]{3}")]}
    with pytest.raises(Exception, match="the grammar failed"):
        _run(engine, program)


def test_an_error_in_the_continue_hook_ends_the_program(engine, monkeypatch):
    ex = engine.programs
    monkeypatch.setattr(ex, "_finish_gen", lambda *a: (_ for _ in ()).throw(RuntimeError("boom (test)")))
    program = {"ops": [{"op": "text", "text": "Q:"}, _gen(1, max_new_tokens=2), {"op": "text", "text": " A:"},
                       _gen(2, max_new_tokens=2)]}  # fmt: skip
    out = _run(engine, program)
    assert "boom (test)" in out["error"] and out["results"] == {}


def test_programs_finish_through_retractions_with_the_same_outputs(engine):
    """With a KV pool too small for all of them, decoding retracts requests back to waiting (no
    finish, no wake) and resumes them; every program still ends, with the outputs it has alone."""
    from radixflow import Engine

    programs = [{"ops": [{"op": "text", "text": f"Story {i}: once upon a time"}, _gen(1, max_new_tokens=40, ignore_eos=True),
                         {"op": "text", "text": " The end."}, _gen(2, max_new_tokens=8, ignore_eos=True)]}
                for i in range(5)]  # fmt: skip
    ref = engine.run_program(programs)
    with Engine(max_total_tokens=220, admission_rule="ratio") as small:  # the rule that over-commits
        got = small.run_program(programs)
        assert small.scheduler.stats.retractions > 0
    texts = lambda outs: [{k: v["text"] for k, v in o["results"].items()} for o in outs]  # noqa: E731
    assert texts(got) == texts(ref)


def test_a_continued_gens_meta_counts_its_own_retractions():
    """A gen that continues its request (request_segments.start_segment) reported the request's retractions since
    its first gen (review, session 30); it now counts those since its segment started, as its latency does."""
    from types import SimpleNamespace

    from radixflow.runtime.programs.program_meta import request_facts
    from radixflow.runtime.programs.request_segments import start_segment

    req = Req("r", [1, 2], SamplingParams.from_dict({}), output_ids=[3])
    req.num_retractions = 2
    start_segment(req, [4], SamplingParams.from_dict({}), SimpleNamespace(prompt_tokens=0, cached_tokens=0))
    req.num_retractions += 1
    facts = request_facts(req)
    assert facts["num_retractions"] == 1 and facts["id"] == "r"
