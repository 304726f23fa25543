"""auto runs a program template of exactly one model call eagerly (Function.one_call_eagerly):
its request graph would be that one request, and the graph path only adds work around it. The
outputs are the request graph's; programs with more calls, a fork or n > 1, explicit
mode="graph", streams and run_batch keep the graph."""

from __future__ import annotations

import pytest

import radixflow as rf
from radixflow.lang.backends.engine_backend import EngineBackend
from radixflow.lang.function import Function
from radixflow.lang.trace_templates import one_model_call
from radixflow.runtime.programs.program_ops import parse_program

GREEDY = {"temperature": 0, "max_new_tokens": 3}


@rf.function
def one_gen(s, context, question):
    s += context + "Q: " + question + "\nA:" + rf.gen("a", max_tokens=3, stop="\n")


@rf.function
def one_select(s, context, options):
    s += context + "The colour is"
    s += rf.select("c", options)


@rf.function
def two_gens(s, question):
    s += "Q: " + question + "\nA:" + rf.gen("a", max_tokens=3) + "\nWhy?" + rf.gen("b", max_tokens=3)


@rf.function
def samples(s, question):
    s += "Q: " + question + rf.gen("a", max_tokens=3, n=2)


@rf.function
def forked(s, question):
    s += "Q: " + question
    forks = s.fork(2)
    forks += rf.gen("a", max_tokens=2)
    forks.join()


def _out(st) -> tuple:
    return st.text(), st.variables()


@pytest.mark.parametrize("fn, kw", [
    (one_gen, {"context": "Facts: the sky is blue.\n", "question": "What colour is the sky?"}),
    (one_select, {"context": "Grass. ", "options": [" green", " red"]}),
])  # fmt: skip
def test_auto_runs_a_one_call_template_eagerly_with_the_graphs_outputs(engine, fn, kw):
    b = EngineBackend.for_engine(engine)
    fn.templates.clear()
    graph = fn.run(backend=b, mode="graph", **kw, **GREEDY)
    auto = [fn.run(backend=b, **kw, **GREEDY) for _ in range(2)]  # the template's first use, then a hit
    assert graph.mode == "graph" and [st.mode for st in auto] == ["eager", "eager"]
    assert all(_out(st) == _out(graph) for st in auto)


def test_the_rule_switched_off_keeps_the_graph(engine, monkeypatch):
    b = EngineBackend.for_engine(engine)
    monkeypatch.setattr(Function, "one_call_eagerly", False)
    assert one_gen.run(backend=b, context="", question="Why?", **GREEDY).mode == "graph"


def test_more_than_one_call_a_fork_or_samples_stay_graphs(engine):
    b = EngineBackend.for_engine(engine)
    assert two_gens.run(backend=b, question="Why?", **GREEDY).mode == "graph"
    assert samples.run(backend=b, question="Why?", **GREEDY).mode == "graph"
    assert forked.run(backend=b, question="Why?", **GREEDY).mode == "graph"


def test_streams_and_batches_of_one_call_programs_stay_graphs(engine):
    b = EngineBackend.for_engine(engine)
    kw = {"context": "", "question": "Why?"}
    streamed = one_gen.run(backend=b, stream=True, **kw, **GREEDY)
    "".join(streamed.text_iter())
    assert streamed.mode == "graph"
    batch = one_gen.run_batch([kw, {"context": "x\n", "question": "Who?"}], backend=b, progress_bar=False, **GREEDY)
    assert [st.mode for st in batch] == ["graph", "graph"]


def test_one_model_call_counts_gens_selects_and_forks():
    gen = {"op": "gen", "id": 1, "sampling_params": {"max_new_tokens": 2}}
    sel = {"op": "select", "id": 2, "choices": ["a", "b"]}
    text = {"op": "text", "text": "Q:"}
    ops = lambda *o: parse_program({"ops": list(o)})  # noqa: E731
    assert one_model_call(ops(text, gen)) and one_model_call(ops(text, sel, text))
    assert not one_model_call(ops(text, gen, text, {**gen, "id": 3}))
    assert not one_model_call(ops(text, {**gen, "sampling_params": {"max_new_tokens": 2, "n": 2}}))
    fork = {"op": "fork", "id": 4, "branches": [[gen], [{**gen, "id": 5}]]}
    assert not one_model_call(ops(text, fork, {"op": "join", "fork": 4}))
