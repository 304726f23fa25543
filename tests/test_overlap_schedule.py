"""Overlap scheduling: launching decode pass n+1 before reading back pass n must not
change any output, and must leave the KV bookkeeping consistent.

The shared engine runs on CPU, where overlap is off by default; these tests switch it
on (it is the default on CUDA) and compare with the same engine's outputs with it off.
"""

from __future__ import annotations

import json
from contextlib import contextmanager, nullcontext
from typing import Optional

import pytest
from conftest import PROMPTS
from radixflow import Engine

MIXED = [
    {"max_new_tokens": 1, "temperature": 0},
    {"max_new_tokens": 2, "temperature": 0},
    {"max_new_tokens": 17, "temperature": 0},
    {"max_new_tokens": 40, "temperature": 0, "stop": ["\n"]},
    {"max_new_tokens": 30, "temperature": 0, "ignore_eos": True},
    {"max_new_tokens": 24, "temperature": 0.8, "sampling_seed": 7},
    {"max_new_tokens": 24, "temperature": 0, "stop_token_ids": [28]},
    {"max_new_tokens": 33, "temperature": 0, "min_new_tokens": 3},
]


@contextmanager
def overlap_on(engine, cold_chunk: Optional[int] = None, decodes: bool = True):
    """Overlap on for the block. `cold_chunk`: first flush the radix cache and chunk prefills to this many
    tokens, so that prompts end in extend passes read back after the next one is launched (with the cache
    left by a reference run, every prompt extends by one token and is read back before a decode pass).
    `decodes`: the block runs decode passes, so some must have been chained (False: prefill only)."""
    sched = engine.scheduler
    chained, late = sched.stats.chained_decode_steps, sched.stats.late_extend_read_backs
    chunk = sched.args.chunked_prefill_size
    if cold_chunk:
        assert engine.stepper.exclusive(sched.flush_cache), "the engine must be idle"
        sched.args.chunked_prefill_size = cold_chunk
    sched.overlap = True
    try:
        yield sched
    finally:
        sched.overlap = False
        sched.args.chunked_prefill_size = chunk
        assert not decodes or sched.stats.chained_decode_steps > chained, "overlap was never used"
        assert not cold_chunk or sched.stats.late_extend_read_backs > late, "no extend pass was read back late"


def _outputs(results: list) -> list:
    return [(o["output_ids"], o["meta_info"]["finish_reason"]) for o in results]


def _settle(sched) -> None:
    """Run until idle, then check that no KV page is lost (a pass still in flight holds only
    finished requests, which own no slots)."""
    while sched.has_work():
        sched.step()
    sched.check_invariants()


def test_overlap_gives_the_same_outputs(engine):
    ref = _outputs(engine.generate(PROMPTS, MIXED))
    with overlap_on(engine, cold_chunk=16) as sched:
        got = _outputs(engine.generate(PROMPTS, MIXED))
        _settle(sched)
    assert got == ref


def test_penalty_and_logprob_rows_overlap_with_the_same_outputs(engine):
    """Penalties need the host's view of every token (their pass is sampled after the read-back);
    logprobs are read from each pass's own results: neither takes the batch out of overlap."""
    params = [dict(MIXED[4]) for _ in PROMPTS[:4]]
    params[1]["repetition_penalty"] = 1.3
    params[1]["max_new_tokens"] = params[2]["max_new_tokens"] = 10
    ref = engine.generate(PROMPTS[:4], params, return_logprob=[False, False, True, False])
    with overlap_on(engine, cold_chunk=16) as sched:
        before = sched.stats.chained_decode_steps
        got = engine.generate(PROMPTS[:4], params, return_logprob=[False, False, True, False])
        _settle(sched)
        chained = sched.stats.chained_decode_steps - before
    assert _outputs(got) == _outputs(ref)
    assert chained >= 25, chained  # 30 tokens: nearly every decode pass chained, the penalty row's too
    lp = [x[0] for x in got[2]["meta_info"]["output_token_logprobs"]]
    lp_ref = [x[0] for x in ref[2]["meta_info"]["output_token_logprobs"]]
    assert len(lp) == len(lp_ref) == 10 and max(abs(a - b) for a, b in zip(lp, lp_ref)) < 1e-4


def test_abort_while_a_pass_is_in_flight(engine):
    params = {"max_new_tokens": 30, "temperature": 0, "ignore_eos": True}
    ref = _outputs(engine.generate(PROMPTS[:3], params))
    with overlap_on(engine, cold_chunk=16) as sched:
        stream = engine.generate(PROMPTS[:3], params, stream=True)
        for _ in range(12):
            next(stream)
        assert sched.inflight is not None
        stream.close()  # aborts the unfinished requests
        _settle(sched)
        assert _outputs(engine.generate(PROMPTS[:3], params)) == ref
        _settle(sched)


def test_overlap_under_kv_pressure_retracts_and_keeps_outputs(engine):
    long_prompts = [p * 2 for p in PROMPTS[:4]]
    params = {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}
    ref = [o["output_ids"] for o in engine.generate(long_prompts, params)]
    with Engine(max_total_tokens=220, overlap_schedule="on", admission_rule="ratio") as small:  # it over-commits
        outs = small.generate(long_prompts, params)
        assert small.scheduler.stats.retractions > 0
        assert small.scheduler.stats.chained_decode_steps > 0
        assert [o["output_ids"] for o in outs] == ref
        _settle(small.scheduler)


def test_overlap_and_batch_defaults_follow_the_device():
    from radixflow import ServerArgs
    from radixflow.errors import RadixflowError

    args = ServerArgs()
    assert args.overlap_enabled("cuda") and not args.overlap_enabled("cpu")
    assert ServerArgs(overlap_schedule="on").overlap_enabled("cpu")
    assert not ServerArgs(overlap_schedule="off").overlap_enabled("cuda")
    assert not ServerArgs(disable_overlap_schedule=True).overlap_enabled("cuda")
    assert ServerArgs().resolve_max_running("cuda") == 1024 and ServerArgs().resolve_max_running("cpu") == 256
    assert ServerArgs(max_running_requests=8).resolve_max_running("cuda") == 8
    assert ServerArgs().graph_max_bs("cuda") == 1024  # every batch the scheduler runs replays a graph
    assert ServerArgs(max_running_requests=96).graph_max_bs("cuda") == 96
    assert ServerArgs(cuda_graph_max_bs=64).graph_max_bs("cuda") == 64
    with pytest.raises(RadixflowError, match="cuda_graph_max_bs"):
        ServerArgs(cuda_graph_max_bs=-1)


def _constrained_batch() -> tuple[list, list]:
    """Greedy grammar rows (JSON schemas with forced keys for jump-forward, a regex, choices,
    a dtype) beside free rows and rows that need the host's view (penalties, min_new_tokens)."""
    from constrained_corpus import SCHEMAS
    from radixflow.constrained import regex_for_choices, regex_for_dtype

    g = {"temperature": 0}
    params = [
        dict(g, json_schema=SCHEMAS[1], max_new_tokens=48),
        dict(g, json_schema=SCHEMAS[5], max_new_tokens=48),
        dict(g, regex=r"[0-9]{3}-[0-9]{4} \((home|work)\)", max_new_tokens=20),
        dict(g, regex=regex_for_choices(["red", "green", "blue"]), max_new_tokens=8),
        dict(g, regex=regex_for_dtype(int), max_new_tokens=8),
        dict(g, max_new_tokens=24, ignore_eos=True),
        dict(g, max_new_tokens=20, repetition_penalty=1.3, frequency_penalty=0.5),
        dict(g, max_new_tokens=16, min_new_tokens=6),
    ]
    prompts = ["Write a JSON movie record:\n", "Write a JSON record:\n", "Phone:", "A color:", "A number:"] + PROMPTS[:3]
    return prompts, params


def test_constrained_rows_overlap_with_the_same_outputs(engine):
    """Grammar rows take part in overlap (masks filled while the next pass runs, forced
    tokens fed one a pass): greedy outputs equal the non-overlapped path's, jump-forward included."""
    prompts, params = _constrained_batch()
    ref = engine.generate(prompts, params)
    assert sum(o["meta_info"].get("jump_forward_tokens", 0) for o in ref) > 0, "the batch must exercise jump-forward"
    with overlap_on(engine, cold_chunk=16) as sched:
        fed = sched.stats.fed_rows
        got = engine.generate(prompts, params, return_logprob=[False] * 7 + [True])
        _settle(sched)
        assert sched.stats.fed_rows > fed, "forced tokens must have been fed in overlapped passes"
    assert _outputs(got) == _outputs(ref)
    assert [o["meta_info"].get("jump_forward_tokens", 0) for o in got] == [o["meta_info"].get("jump_forward_tokens", 0) for o in ref]
    assert len(got[7]["meta_info"]["output_token_logprobs"]) == got[7]["meta_info"]["completion_tokens"]


def test_large_overlapped_batches_jump_only_at_admission(engine):
    """Under overlap a batch above --jump-forward-max-batch takes no jump after a sampled token
    (its forced tokens would be fed one a pass anyway): with the limit at 0, greedy outputs equal
    the non-overlapped path with those jumps turned off too, and the batch jumps less than with
    them on (the first jump, before the prefill, stays)."""
    import dataclasses

    prompts, params = _constrained_batch()
    sched = engine.scheduler
    full = engine.generate(prompts, params)
    sched.jumps_after_sampling = lambda rows: False
    try:
        ref = engine.generate(prompts, params)
    finally:
        del sched.jumps_after_sampling
    saved = sched.args
    try:
        sched.args = dataclasses.replace(saved, jump_forward_max_batch=4)
        with overlap_on(engine, cold_chunk=16) as sched:
            assert sched.jumps_after_sampling(4) and not sched.jumps_after_sampling(5)
            sched.args = dataclasses.replace(sched.args, jump_forward_max_batch=0)  # keeps the cold chunk size
            got = engine.generate(prompts, params)
            _settle(sched)
    finally:
        sched.args = saved
    assert sched.jumps_after_sampling(len(prompts)), "without overlap every jump is taken"
    assert _outputs(got) == _outputs(ref)
    jumped = lambda outs: [o["meta_info"].get("jump_forward_tokens", 0) for o in outs]  # noqa: E731
    assert jumped(got) == jumped(ref)
    assert 0 < sum(jumped(got)) < sum(jumped(full)), "admission jumps stay, later ones go"


def test_constrained_overlap_on_outlines(engine):
    """The outlines backend (llguidance is the engine's here, covered above) gathers its rows'
    masks from per-state masks; outputs match without overlap. Its rows jump in any batch (a
    jump is cheap there and can shorten the output), but above --jump-forward-max-batch only by
    appending: a jump that re-tokenizes the sampled token would waste the pass launched on it. With
    the limit at 0 they take every jump the non-overlapped path takes with such cuts off too (same
    outputs, same jumps, no cut), while that path with cuts on does cut in this batch."""
    import dataclasses

    from radixflow.constrained.backend import GrammarBackend

    sched = engine.scheduler
    saved = (sched.grammar_backend, sched.jump_forward, sched.args)
    args = dataclasses.replace(sched.args, grammar_backend="outlines")
    sched.grammar_backend = GrammarBackend(engine.tokenizer, engine.runner.vocab_size, engine.eos_ids, args)
    sched.jump_forward = sched.grammar_backend.jump_forward
    cuts, rewind = [], sched.rewind
    sched.rewind = lambda req, keep: (cuts.append(req.rid), rewind(req, keep))[1]
    try:
        prompts, params = _constrained_batch()
        engine.generate(prompts[:3], params[:3])
        cut_with_them = len(cuts)
        sched.jumps_after_sampling = lambda rows: False
        ref = engine.generate(prompts[:3], params[:3])
        del sched.jumps_after_sampling
        cut_without = len(cuts) - cut_with_them
        with overlap_on(engine):
            sched.args = dataclasses.replace(sched.args, jump_forward_max_batch=0)
            got = engine.generate(prompts[:3], params[:3])
            _settle(sched)
    finally:
        sched.__dict__.pop("jumps_after_sampling", None)
        del sched.rewind
        sched.grammar_backend.cache.pool.shutdown(wait=False)
        sched.grammar_backend, sched.jump_forward, sched.args = saved
    assert cut_with_them > 0 and cut_without == 0, (cut_with_them, cut_without)
    assert len(cuts) == cut_with_them, "an overlapped batch above the limit cut a sampled token back"
    assert _outputs(got) == _outputs(ref)
    jumped = [o["meta_info"].get("jump_forward_tokens", 0) for o in got]
    assert jumped == [o["meta_info"].get("jump_forward_tokens", 0) for o in ref] and sum(jumped) > 0


def test_a_long_forced_run_does_not_drain_an_overlapped_batch(engine, monkeypatch):
    """A forced run longer than a row may feed (a 40-token const between sampled values) is
    jumped over in pieces under overlap, so the row never holds more than MAX_FED_TOKENS tokens
    without KV (more would drain the whole batch for an extend pass); the text is the
    non-overlapped path's and the output valid."""
    import dataclasses

    from radixflow.constrained.backend import GrammarBackend
    from radixflow.runtime.scheduling import overlap

    note = "the quick brown fox jumps over the lazy dog and " * 4
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"const": note}, "n": {"type": "integer"}},
              "required": ["ok", "note", "n"], "additionalProperties": False}  # fmt: skip
    prompts = ["Status:", "Another status:", PROMPTS[0]]
    params = [{"temperature": 0, "max_new_tokens": 120, "json_schema": json.dumps(schema)}] * 2 + [{"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}]
    sched = engine.scheduler
    saved = (sched.grammar_backend, sched.jump_forward, sched.args)
    args = dataclasses.replace(sched.args, grammar_backend="outlines")
    sched.grammar_backend = GrammarBackend(engine.tokenizer, engine.runner.vocab_size, engine.eos_ids, args)
    sched.jump_forward = sched.grammar_backend.jump_forward
    seen, check = [], overlap.overlappable
    monkeypatch.setattr(overlap, "overlappable", lambda req, pending: (seen.append(pending), check(req, pending))[1])
    try:
        ref = engine.generate(prompts, params)
        with overlap_on(engine):
            got = engine.generate(prompts, params)
            _settle(sched)
    finally:
        sched.grammar_backend.cache.pool.shutdown(wait=False)
        sched.grammar_backend, sched.jump_forward, sched.args = saved
    assert seen and max(seen) <= overlap.MAX_FED_TOKENS, max(seen)
    assert [o["text"] for o in got] == [o["text"] for o in ref]
    for out in got[:2]:
        assert json.loads(out["text"])["note"] == note
        assert out["meta_info"]["jump_forward_tokens"] > overlap.MAX_FED_TOKENS, "the run was jumped over, in pieces"


def _gen(i: int, **sp) -> dict:
    return {"op": "gen", "id": i, "name": f"g{i}", "sampling_params": {"temperature": 0, **sp}}


GRAPHS = [
    {"ops": [{"op": "text", "text": "The capital of France is"}, _gen(1, max_new_tokens=14, ignore_eos=True)]},
    {"ops": [{"op": "text", "text": "Q: Name a color.\nA:"}, _gen(1, max_new_tokens=4),
             {"op": "text", "text": "\nQ: Another one?\nA:"}, _gen(2, max_new_tokens=6)]},  # fmt: skip
    {"ops": [{"op": "text", "text": "Count: 1, 2,"}, _gen(1, max_new_tokens=9, stop=" 7"),
             {"op": "select", "id": 2, "name": "s", "choices": [" yes", " no"], "method": "token_length_normalized"},
             {"op": "text", "text": "."}, _gen(3, max_new_tokens=10, ignore_eos=True)]},  # fmt: skip
]


def test_request_graphs_overlap_with_the_same_outputs(engine):
    """A graph's gen whose request retires after it (the last gen, one before a select or a
    fork) overlaps its passes like any request; only one that the next gen continues cannot."""
    ref = engine.run_program(GRAPHS)
    with overlap_on(engine, cold_chunk=8) as sched:
        got = engine.run_program(GRAPHS)
        _settle(sched)
    texts = lambda outs: [{k: v["text"] for k, v in o["results"].items()} for o in outs]  # noqa: E731
    assert texts(got) == texts(ref)
    assert [o["meta_info"]["continued_segments"] for o in got] == [0, 1, 0]


def test_a_graphs_last_segment_overlaps(engine):
    """A continued request is `continuable` only while another gen will continue it: its last
    segment's decode passes overlap (before, the flag stayed from the first gen and no pass of
    this one-request program chained)."""
    graph = {"ops": [{"op": "text", "text": "Q: Name a color.\nA:"}, _gen(1, max_new_tokens=3, ignore_eos=True),
                     {"op": "text", "text": "\nQ: Another one?\nA:"}, _gen(2, max_new_tokens=12, ignore_eos=True)]}  # fmt: skip
    ref = engine.run_program(graph)
    with overlap_on(engine) as sched:
        got = engine.run_program(graph)
        _settle(sched)
    assert got["meta_info"]["continued_segments"] == 1
    assert {k: v["text"] for k, v in got["results"].items()} == {k: v["text"] for k, v in ref["results"].items()}


def test_a_last_segments_prompt_is_one_extend_pass_not_fed_a_token_a_pass(engine):
    """Programs in step whose last gens continue their requests: the text before those gens is computed in
    one extend pass (before, it was fed one token a decode pass, every row's sample dropped: as many passes
    as the text has tokens), and the outputs are the non-overlapped path's."""
    text = "\nQ: And one more, in other words?\nA:"
    graphs = [{"ops": [{"op": "text", "text": f"Q: Name a color ({i}).\nA:"}, _gen(1, max_new_tokens=3, ignore_eos=True),
                       {"op": "text", "text": text}, _gen(2, max_new_tokens=5, ignore_eos=True)]} for i in range(4)]  # fmt: skip
    assert len(engine.tokenizer.encode(text)) >= 4
    ref = engine.run_program(graphs)
    sched = engine.scheduler
    fed, steps = sched.stats.fed_rows, sched.stats.forward_steps
    with overlap_on(engine):
        got = engine.run_program(graphs)
        _settle(sched)
    assert [o["meta_info"]["continued_segments"] for o in got] == [1] * 4
    assert [{k: v["text"] for k, v in o["results"].items()} for o in got] == [
        {k: v["text"] for k, v in o["results"].items()} for o in ref]
    assert sched.stats.fed_rows == fed, "the last segment's prompt was fed a token a pass"
    assert sched.stats.forward_steps - steps <= 1 + 3 + 1 + 5 + 1  # prefill, gen 1, the text, gen 2, one overlapped


def test_a_few_continuing_rows_run_as_an_extend_pass_and_a_decode_pass(engine, monkeypatch):
    """One program's request continues (its next text appended, another gen to come: no overlap) while three
    others decode: the step runs an extend pass of that row and a decode pass of the three (before, one extend
    pass of all four rows, which costs a GPU far more), with or without overlap, and greedy outputs are the
    one mixed pass's."""
    from radixflow.runtime.execution.forward_batch import ForwardMode
    from radixflow.runtime.scheduling import split_decode

    graphs = [{"ops": [{"op": "text", "text": "Q: Name a color.\nA:"}, _gen(1, max_new_tokens=2, ignore_eos=True),
                       {"op": "text", "text": "\nQ: Another one?\nA:"}, _gen(2, max_new_tokens=3, ignore_eos=True),
                       {"op": "text", "text": "\nQ: A third?\nA:"}, _gen(3, max_new_tokens=2, ignore_eos=True)]}]
    graphs += [{"ops": [{"op": "text", "text": f"Count to ten ({i}):"}, _gen(1, max_new_tokens=14, ignore_eos=True)]}
               for i in range(3)]  # fmt: skip
    texts = lambda outs: [{k: v["text"] for k, v in o["results"].items()} for o in outs]  # noqa: E731
    sched = engine.scheduler
    passes, forward = [], sched.runner.forward
    monkeypatch.setattr(sched.runner, "forward", lambda fb: (passes.append((fb.mode, len(fb.seq_lens_list))), forward(fb))[1])
    with monkeypatch.context() as m:
        m.setattr(split_decode, "SPLIT_MAX_CONTINUING_SHARE", 0.0)  # the old behaviour: one mixed pass
        ref = engine.run_program(graphs)
    assert (ForwardMode.EXTEND, 4) in passes[1:], "the continuing row's step ran as one mixed pass"
    split = sched.stats.split_decode_steps
    for overlap in (False, True):
        passes.clear()
        with overlap_on(engine) if overlap else nullcontext():
            got = engine.run_program(graphs)
            _settle(sched)
        assert texts(got) == texts(ref), f"overlap {overlap}"
        at = passes.index((ForwardMode.EXTEND, 1))
        assert passes[at + 1] == (ForwardMode.DECODE, 3) and (ForwardMode.EXTEND, 4) not in passes[1:], passes
        assert sched.stats.split_decode_steps > split
        split = sched.stats.split_decode_steps


def test_the_split_rule_takes_at_most_half_the_rows_continuing():
    from radixflow.runtime.scheduling.split_decode import splits

    assert splits([8, 1, 1, 1]) and splits([8, 8, 1, 1])
    assert not splits([8, 8, 8, 1]) and not splits([1, 1, 1]) and not splits([8])
    # jump-forward's forced tokens (a continuing row with a grammar) stay in the mixed pass
    from types import SimpleNamespace

    rows = [SimpleNamespace(grammar=g) for g in (object(), None, None, None)]
    assert not splits([8, 1, 1, 1], rows) and splits([1, 8, 1, 1], rows)


class _ThreePrompts:
    """Three 30-token prompts in 24-token passes on a flushed cache: the first prompt ends in pass 2, the
    second in pass 3. Records, at each forward call, how many tokens the first prompt has read back."""

    PARAMS = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}

    def __init__(self, engine):
        from radixflow.runtime.sampling_params import SamplingParams
        from radixflow.runtime.scheduling.req import Req

        text = engine.tokenizer.encode(" ".join(PROMPTS))
        self.prompts = [text[0:30], text[30:60], text[60:90]]
        self.reqs = [Req(rid=f"x{i}", origin_input_ids=p, sampling=SamplingParams(**self.PARAMS)) for i, p in enumerate(self.prompts)]
        self.engine, self.sched, self.seen = engine, engine.scheduler, []

    def run_two_passes(self) -> None:
        """Admit the prompts and run passes 1 and 2 (overlap on, prefills chunked to 24)."""
        sched, forward = self.sched, self.sched.runner.forward
        sched.runner.forward = lambda fb: (self.seen.append(len(self.reqs[0].output_ids)), forward(fb))[1]
        assert self.engine.stepper.exclusive(sched.flush_cache)  # no radix hits: every prompt computed whole
        self.engine.stepper.exclusive(lambda: [sched.add_request(r) for r in self.reqs])
        for _ in range(2):
            self.engine.stepper.exclusive(sched.step)
        assert sched.pending_extend is not None and sched.pending_extend.reqs == [self.reqs[0]]
        assert self.reqs[0].output_ids == [] and self.reqs[0] in sched.running  # admitted, its token on the device

    def finish(self) -> list:
        while self.sched.has_work():
            self.engine.stepper.exclusive(self.sched.step)
        self.sched.check_invariants()
        return [(r.output_ids, r.finish_reason) for r in self.reqs]

    def restore(self) -> None:
        self.sched.runner.__dict__.pop("forward", None)


@contextmanager
def _three_prompts(engine):
    sched = engine.scheduler
    chunk, sched.args.chunked_prefill_size = sched.args.chunked_prefill_size, 24
    run = _ThreePrompts(engine)
    try:
        with overlap_on(engine):
            yield run
    finally:
        run.restore()
        sched.args.chunked_prefill_size = chunk


def _reference(engine) -> list:
    sched = engine.scheduler
    chunk, sched.args.chunked_prefill_size = sched.args.chunked_prefill_size, 24
    try:
        return _outputs(engine.generate(input_ids=_ThreePrompts(engine).prompts, sampling_params=_ThreePrompts.PARAMS))
    finally:
        sched.args.chunked_prefill_size = chunk


def test_extend_passes_are_read_back_after_the_next_pass_is_launched(engine):
    """With overlap on, a prompt that ends in an extend pass gets its first token once the next step has
    launched its own pass, not before; outputs as without overlap."""
    ref = _reference(engine)
    with _three_prompts(engine) as run:
        run.run_two_passes()
        run.engine.stepper.exclusive(run.sched.step)  # launches pass 3, then reads the first prompt's token back
        assert run.seen == [0, 0, 0], "pass 3 must be launched before the first prompt's token is read back"
        assert len(run.reqs[0].output_ids) == 1 and run.reqs[1].output_ids == [] and run.sched.pending_extend.reqs == [run.reqs[1]]
        assert run.finish() == ref


class _Arrived:
    """Stands in for the copy's CUDA event, already completed."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


def test_tokens_already_on_the_host_are_read_back_before_the_next_pass(engine):
    """When the pending pass's copy has completed by the next step, its tokens are read back first (the
    first token need not wait for the next pass to be built and launched)."""
    ref = _reference(engine)
    with _three_prompts(engine) as run:
        run.run_two_passes()
        run.sched.pending_extend.ready = _Arrived()
        run.engine.stepper.exclusive(run.sched.step)
        assert run.seen == [0, 0, 1] and run.sched.pending_extend.reqs == [run.reqs[1]]
        assert run.finish() == ref


def test_a_failed_read_back_keeps_the_new_pass(engine):
    """If advancing the previous pass's requests raises (a grammar, a continue hook, a stop check), the pass
    just launched stays pending: its requests still get their first tokens."""
    with _three_prompts(engine) as run:
        sched = run.sched

        def fail(*args, **kw):
            raise RuntimeError("advance failed")

        run.run_two_passes()
        sched._advance = fail
        try:
            with pytest.raises(RuntimeError, match="advance failed"):
                run.engine.stepper.exclusive(sched.step)
        finally:
            del sched._advance
        assert sched.pending_extend is not None and sched.pending_extend.reqs == [run.reqs[1]]
        run.engine.stepper.exclusive(lambda: sched.abort("x0"))  # its token was lost with the failure
        outs = run.finish()
    assert [len(ids) for ids, _ in outs] == [0, 6, 6]


@contextmanager
def _recording_passes(sched, record):
    """Call record(fb) as each forward pass of the block is launched (before it runs)."""
    forward = sched.runner.forward
    sched.runner.forward = lambda fb: (record(fb), forward(fb))[1]
    try:
        yield
    finally:
        sched.runner.__dict__.pop("forward", None)


def test_an_extend_pass_is_launched_behind_the_decode_pass_in_flight(engine):
    """A request admitted while a decode pass is in flight has its extend pass launched before that decode
    pass is read back (on a GPU the read-back then runs while the extend pass does); outputs as without overlap."""
    from radixflow.runtime.execution.forward_batch import ForwardMode
    from radixflow.runtime.sampling_params import SamplingParams
    from radixflow.runtime.scheduling.req import Req

    text = engine.tokenizer.encode(" ".join(PROMPTS))
    params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    prompts = [text[0:30], text[40:70]]
    ref = _outputs(engine.generate(input_ids=prompts, sampling_params=params))
    first, late = (Req(rid=f"b{i}", origin_input_ids=p, sampling=SamplingParams(**params)) for i, p in enumerate(prompts))
    sched, seen = engine.scheduler, []
    with _recording_passes(sched, lambda fb: seen.append((fb.mode, len(first.output_ids)))), overlap_on(engine):
        engine.stepper.exclusive(lambda: sched.add_request(first))
        while sched.inflight is None:
            engine.stepper.exclusive(sched.step)
        decoded = len(first.output_ids)
        engine.stepper.exclusive(lambda: sched.add_request(late))
        engine.stepper.exclusive(sched.step)
        assert seen[-1] == (ForwardMode.EXTEND, decoded), "the extend pass must launch before the read-back"
        assert len(first.output_ids) == decoded + 1 and sched.inflight is None
        _settle(sched)
    assert [(r.output_ids, r.finish_reason) for r in (first, late)] == ref


def test_the_first_decode_pass_launches_before_the_extend_pass_is_read_back(engine):
    """After an extend pass, the first decode pass takes the new rows' first tokens from the device: it is
    launched before they are read back (a penalty's rows are sampled after the read-back); outputs as without overlap."""
    from radixflow.runtime.execution.forward_batch import ForwardMode
    from radixflow.runtime.sampling_params import SamplingParams
    from radixflow.runtime.scheduling.req import Req

    text = engine.tokenizer.encode(" ".join(PROMPTS))
    params = [{"max_new_tokens": 5, "temperature": 0, "ignore_eos": True},
              {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True, "frequency_penalty": 0.5}]
    for param in params:
        ref = _outputs(engine.generate(input_ids=[text[0:30], text[30:50]], sampling_params=param))
        reqs = [Req(rid=f"d{i}", origin_input_ids=p, sampling=SamplingParams(**param)) for i, p in enumerate([text[0:30], text[30:50]])]
        sched, seen = engine.scheduler, []
        with _recording_passes(sched, lambda fb: seen.append((fb.mode, len(reqs[0].output_ids)))), overlap_on(engine):
            engine.stepper.exclusive(lambda: [sched.add_request(r) for r in reqs])
            engine.stepper.exclusive(sched.step)
            assert sched.pending_extend is not None and reqs[0].output_ids == []
            engine.stepper.exclusive(sched.step)
            assert seen[-1] == (ForwardMode.DECODE, 0), "the decode pass must launch before the read-back"
            assert sched.pending_extend is None and len(reqs[0].output_ids) == 1 and sched.inflight is not None
            _settle(sched)
        assert [(r.output_ids, r.finish_reason) for r in reqs] == ref


@pytest.mark.parametrize("seed", [0, 2])  # schedules that take both new orders
def test_requests_arriving_between_overlapped_passes_keep_their_outputs(engine, seed):
    """Requests of mixed parameters (stops, penalties, min_new_tokens, sampled with a seed) arrive at random
    steps while others decode, so extend passes launch behind decode passes in flight and decode passes
    before extend read-backs, in every order the schedule gives; outputs as without overlap, no KV lost."""
    import random

    from radixflow.runtime.sampling_params import SamplingParams
    from radixflow.runtime.scheduling.req import Req

    rng = random.Random(seed)
    params = MIXED + [{"max_new_tokens": 12, "temperature": 0, "frequency_penalty": 0.7},
                      {"max_new_tokens": 9, "temperature": 0, "presence_penalty": 0.5, "stop": [" the"]}]
    picks = [(p, rng.choice(params)) for p in rng.sample(PROMPTS, 6)]
    ref = [_outputs(engine.generate([p], q))[0] for p, q in picks]
    reqs = [Req(rid=f"s{seed}-{i}", origin_input_ids=engine.tokenizer.encode(p), sampling=SamplingParams.from_dict(q))
            for i, (p, q) in enumerate(picks)]
    arrivals = sorted(rng.randrange(0, 12) for _ in reqs)
    sched, seen = engine.scheduler, set()
    order = lambda fb: seen.add((fb.mode.value, sched.inflight is not None, sched.pending_extend is not None))  # noqa: E731
    with _recording_passes(sched, order), overlap_on(engine, decodes=False):
        step = 0
        while arrivals or sched.has_work():
            while arrivals and arrivals[0] <= step:
                arrivals.pop(0)
                req = reqs[len(reqs) - len(arrivals) - 1]
                engine.stepper.exclusive(lambda: sched.add_request(req))
            engine.stepper.exclusive(sched.step)
            step += 1
        _settle(sched)
    assert [(r.output_ids, r.finish_reason) for r in reqs] == ref
    assert ("decode", False, True) in seen, "no decode pass launched before an extend pass's read-back"
    assert ("extend", True, False) in seen, "no extend pass launched behind a decode pass in flight"


def test_abort_while_an_extend_pass_is_pending(engine):
    """A request aborted between its extend pass and the read-back drops its first token; nothing leaks."""
    from radixflow.runtime.sampling_params import SamplingParams
    from radixflow.runtime.scheduling.req import Req

    text = engine.tokenizer.encode(" ".join(reversed(PROMPTS)))
    reqs = [Req(rid=f"a{i}", origin_input_ids=text[i * 30 : i * 30 + 30], sampling=SamplingParams(max_new_tokens=4, temperature=0, ignore_eos=True))
            for i in range(2)]
    sched = engine.scheduler
    with overlap_on(engine):
        engine.stepper.exclusive(lambda: [sched.add_request(r) for r in reqs])
        engine.stepper.exclusive(sched.step)  # both prompts in one pass: read back by the next step
        assert sched.pending_extend is not None and sched.pending_extend.reqs == reqs
        assert engine.stepper.exclusive(lambda: sched.abort("a0")) is reqs[0]
        engine.stepper.exclusive(sched.step)  # reads the pass back first, then launches a decode pass
        assert sched.pending_extend is None and len(reqs[1].output_ids) == 1 and sched.inflight.reqs == [reqs[1]]
        assert reqs[0].output_ids == [] and reqs[0].finish_reason["type"] == "abort"
        _settle(sched)
    assert len(reqs[1].output_ids) == 4


def test_the_jump_limit_counts_the_whole_decode_batch(engine):
    """Rows that finish their prefill while others decode join that batch: the jump decision counts
    the batch they join (running rows and them), never just the rows advanced in this step."""
    from radixflow.runtime.scheduling.jump_policy import decode_rows, jump_limit, jumps_after_sampling

    assert jumps_after_sampling(False, 500, 16) and jumps_after_sampling(True, 16, 16)
    assert not jumps_after_sampling(True, 17, 16)
    assert jump_limit(False, 40, 10) is None and jump_limit(True, 12, 10) == 16 - 2 - 1
    prompts, params = _constrained_batch()
    seen = []
    import radixflow.runtime.scheduling.scheduler as scheduler_module

    def counted(running, reqs):
        seen.append((decode_rows(running, reqs), len(reqs), len(running)))
        return seen[-1][0]

    with overlap_on(engine, cold_chunk=16) as sched:
        scheduler_module.decode_rows = counted
        try:
            engine.generate(prompts, params)
            _settle(sched)
        finally:
            scheduler_module.decode_rows = decode_rows
    assert seen and all(rows >= max(advanced, running) for rows, advanced, running in seen), seen
    assert any(rows > advanced for rows, advanced, _ in seen), "new rows must be counted with the running ones"
    assert max(rows for rows, _, _ in seen) <= len(prompts)
