"""Request graphs cover streaming, gen(n > 1) and concatenate-and-append: each runs inside
the scheduler (state.mode == "graph", one program submission) and gives eager's greedy
output."""

from __future__ import annotations

import pytest

import radixflow as rf
from radixflow.lang import GenerationError, NotTraceable, ProgramError
from radixflow.lang.backends.engine_backend import EngineBackend

from lang_programs import concat_story, few_shot_qa, one_sentence, tips

GREEDY = {"temperature": 0}


@rf.function
def three_names(s, topic):
    s += f"Name a {topic}:" + rf.gen("name", n=3, max_tokens=4, stop="\n") + "\nAnother one:"
    s += rf.gen("another", max_tokens=4, stop="\n")


@rf.function
def name_then_three(s, topic):
    s += f"Name a {topic}:" + rf.gen("first", max_tokens=4, stop="\n") + "\nThree more:"
    s += rf.gen("more", n=3, max_tokens=4, stop="\n")


@pytest.fixture(scope="module")
def backend(engine):
    return EngineBackend.for_engine(engine)


def graph_and_eager(program, backend, **kwargs):
    graph = program.run(backend=backend, **kwargs, **GREEDY)
    eager = program.run(backend=backend, mode="eager", **kwargs, **GREEDY)
    assert graph.mode == "graph" and eager.mode == "eager"
    return graph, eager


def test_gen_n_samples_run_as_graph_nodes(backend):
    graph, eager = graph_and_eager(three_names, backend, topic="fruit")
    assert isinstance(graph["name"], list) and len(graph["name"]) == 3
    assert graph["name"] == eager["name"] and len(set(graph["name"])) == 1  # greedy: three equal samples
    assert graph["another"] == eager["another"] and graph.text() == eager.text()
    assert graph.program_meta["num_requests"] == 4  # three samples, then the next gen
    assert [m["completion_tokens"] > 0 for m in graph.get_meta_info("name")] == [True] * 3
    with pytest.raises(rf.RadixflowError, match="n must be >= 1"):
        rf.Engine.run_program(backend.engine, _one_gen({"n": 0}))


def test_gen_n_samples_after_a_gen_are_not_its_continuation(backend):
    """A gen followed by text and an n > 1 gen: the samples are requests of their own, not one
    more segment of the first gen's request (which would give one string, not three)."""
    graph, eager = graph_and_eager(name_then_three, backend, topic="fruit")
    assert isinstance(graph["more"], list) and len(graph["more"]) == 3
    assert graph["more"] == eager["more"] and graph["first"] == eager["first"]
    assert graph.program_meta["num_requests"] == 4


def _one_gen(sampling: dict) -> dict:
    return {"ops": [{"op": "text", "text": "Hi"}, {"op": "gen", "id": 0, "name": "x", "sampling_params": sampling}]}


def test_streaming_runs_inside_the_request_graph(backend):
    state = one_sentence.run(topic="the sea", stream=True, backend=backend, **GREEDY)
    deltas = list(state.text_iter("sentence"))
    eager = one_sentence.run(topic="the sea", backend=backend, mode="eager", **GREEDY)
    assert state.mode == "graph" and state.program_meta["num_requests"] == 1
    assert "".join(deltas) == state["sentence"] == eager["sentence"]
    assert len(deltas) > 1, "the gen's text should arrive in token deltas, not at the end"
    assert state.text() == eager.text()


def test_streamed_graph_text_matches_eager_with_fork_and_concat(backend):
    for program, kwargs in ((few_shot_qa, {"question": "What is the capital of Italy?"}), (tips, {"topic": "tea"}),
                            (concat_story, {"name": "Ada"})):  # fmt: skip
        graph = program.run(stream=True, backend=backend, **kwargs, **GREEDY)
        whole = "".join(graph.text_iter())
        eager = program.run(backend=backend, mode="eager", **kwargs, **GREEDY)
        assert graph.mode == "graph" and whole == graph.text() == eager.text()
    assert whole.startswith("A short story about Ada.\n")


def test_streamed_graph_error_surfaces_from_text_iter(backend):
    @rf.function
    def too_long(s):
        s += "x " * 10000 + rf.gen("y", max_tokens=2)

    @rf.function
    def refused(s):
        s += "Q: hi\nA:" + rf.gen("y", max_tokens=2, top_p=5.0)

    state = too_long.run(stream=True, backend=backend)
    with pytest.raises(GenerationError, match="program too_long: .*context"):  # as run() raises it (was a bare
        list(state.text_iter())  # RadixflowError, which `except rf.ProgramError` missed: fuzzing, session 29)
    state = refused.run(stream=True, backend=backend)
    with pytest.raises(GenerationError, match="program refused: .*top_p"):
        state.sync()


def test_concatenate_and_append_reuses_only_the_first_branch(engine, backend, tokenizer):
    """The joined sequence is parent + branch 0 + branch 1. Branch 0's KV sits at the same
    positions after the same tokens, so the radix tree serves it; branch 1's KV was computed
    at the positions right after the parent, without branch 0 before it, so it is recomputed
    (docs/programs.md, "Concatenate-and-append"). From an empty cache, so that no earlier run of
    the program serves the joined sequence: the final gen computes branch 1, the text after the
    join, and at most the last two tokens of branch 0 (a gen's last tokens, which no pass fed back)."""
    engine.flush_cache()
    graph, eager = graph_and_eager(concat_story, backend, name="Ada")
    assert graph.text() == eager.text()
    ending = graph.get_meta_info("ending")
    branch1 = len(tokenizer.encode("Evening:" + graph["part"][1] + "\n", add_special_tokens=False))
    after = len(tokenizer.encode("The end:", add_special_tokens=False))
    recomputed = ending["prompt_tokens"] - ending["cached_tokens"]
    assert branch1 + after <= recomputed <= branch1 + after + 2


@rf.function
def two_answers_with_logprobs(s):
    s += "Q: Name three colors.\nA:" + rf.gen("colors", max_tokens=10, stop=", 3", return_logprob=True, top_logprobs_num=2)
    s += "\nQ: And a fruit?\nA:" + rf.gen("fruit", max_tokens=6, return_logprob=True)


def _lp_values(meta):
    return [round(x[0], 3) for x in meta["output_token_logprobs"]], [x[1] for x in meta["output_token_logprobs"]]


def test_gens_with_output_logprobs_run_and_stream_as_a_graph(backend):
    """A gen asking for output logprobs runs in the request graph (the second as the first's
    continued request); streamed chunks carry their own logprobs, as SGLang's frontend reads them."""
    graph, eager = graph_and_eager(two_answers_with_logprobs, backend)
    assert graph.program_meta["num_requests"] == 1 and graph.text() == eager.text()
    for var in ("colors", "fruit"):
        g, e = graph.get_meta_info(var), eager.get_meta_info(var)
        assert g["output_token_logprobs_length"] == g["completion_tokens"] == e["completion_tokens"]
        assert _lp_values(g) == _lp_values(e)
    assert len(graph.get_meta_info("colors")["output_top_logprobs"][0]) == 2

    for mode in ("graph", "eager"):
        streamed = two_answers_with_logprobs.run(stream=True, backend=backend, mode=mode, **GREEDY)
        for var in ("colors", "fruit"):  # colors ends at its stop string: its last tokens add no text
            chunks = list(streamed.executor.log.iter(var, with_meta=True))
            assert streamed.mode == mode and (len(chunks) > 1 or mode == "eager")  # eager holds text back
            sent = 0
            for text, meta in chunks:
                assert meta["completion_tokens"] == meta["output_token_logprobs_length"]
                assert len(meta["output_token_logprobs"]) == meta["output_token_logprobs_length"] - sent
                sent = meta["output_token_logprobs_length"]
            whole = [lp for _, meta in chunks for lp in meta["output_token_logprobs"]]
            result = streamed.get_meta_info(var)
            assert sent == result["output_token_logprobs_length"] and whole == result["output_token_logprobs"]
        assert streamed.get_meta_info("colors")["finish_reason"]["type"] == "stop"


@rf.function
def tops_only_in_the_second(s):
    s += "Q: Name a color.\nA:" + rf.gen("color", max_tokens=3, return_logprob=True)
    s += "\nQ: And a fruit?\nA:" + rf.gen("fruit", max_tokens=3, return_logprob=True, top_logprobs_num=2)


def test_top_logprobs_of_a_continued_gen_after_one_without_them(backend):
    """The request's top-logprob list only grows while a gen asks for it, so the second gen's
    top logprobs start where that list stood, not where the chosen-token list did."""
    graph, eager = graph_and_eager(tops_only_in_the_second, backend)
    assert graph.program_meta["num_requests"] == 1
    g, e = graph.get_meta_info("fruit"), eager.get_meta_info("fruit")
    tops = lambda m: [[(round(lp, 3), tid) for lp, tid, _ in t] for t in m["output_top_logprobs"]]  # noqa: E731
    assert len(g["output_top_logprobs"]) == g["output_token_logprobs_length"] == 3
    assert tops(g) == tops(e)


@rf.function
def two_samples_with_logprobs(s):
    s += "Count: 1, 2," + rf.gen("more", n=2, max_tokens=3, return_logprob=True)


def test_streamed_gen_n_sends_its_first_samples_logprobs(backend):
    """A streamed gen(n > 1) sends its first sample's text with that sample's logprobs, as eager does."""
    for mode in ("graph", "eager"):
        streamed = two_samples_with_logprobs.run(stream=True, backend=backend, mode=mode, **GREEDY)
        chunks = list(streamed.executor.log.iter("more", with_meta=True))
        first = streamed.get_meta_info("more")[0]
        assert streamed.mode == mode and [text for text, _ in chunks] == [streamed["more"][0]]
        assert chunks[0][1]["output_token_logprobs"] == first["output_token_logprobs"]
        assert chunks[0][1]["output_token_logprobs_length"] == first["output_token_logprobs_length"] == 3


def test_prompt_logprobs_still_make_the_program_eager(backend):
    @rf.function
    def with_prompt_logprobs(s):
        s += "Hello" + rf.gen("x", max_tokens=2, return_logprob=True, logprob_start_len=0)

    assert with_prompt_logprobs.run(backend=backend, **GREEDY).mode == "eager"
    bad = _one_gen({"max_new_tokens": 2})
    bad["ops"][1]["top_logprobs_num"] = -1
    with pytest.raises(rf.RadixflowError, match="top_logprobs_num"):
        backend.engine.run_program(bad)


def test_a_finished_program_and_flushed_trees_leave_no_cyclic_garbage(engine, backend, monkeypatch):
    """A request graph's strands point back to their run, and radix tree nodes to their parent: once
    the run finishes or the cache is flushed, refcounting frees them. Left as cycles, a full garbage
    collection freed them all at once, in one pause during whatever pass was running. (Admission's
    in-batch tails are nested dicts, which hold no cycles.)"""
    import gc
    import weakref

    strands: list = []
    submit = engine.programs.submit

    def spy(*args, **kwargs):
        run = submit(*args, **kwargs)
        strands.append(weakref.ref(run.strands[0]))
        return run

    monkeypatch.setattr(engine.programs, "submit", spy)
    gc.collect()
    gc.disable()
    try:
        state = name_then_three.run(backend=backend, topic="fruit", **GREEDY)
        nodes = [weakref.ref(n) for n in engine.scheduler.tree.nodes()]
        engine.flush_cache()
        assert state.mode == "graph" and len(strands) == 1 and strands[0]() is None
        assert len(nodes) > 1 and all(ref() is None for ref in nodes)
    finally:
        gc.enable()


@rf.function
def sets_variables(s):
    s += "Hi" + rf.gen("a", max_tokens=3)
    s["k"] = "const"
    s["copy"] = s["a"]
    s.set_var("n", [1, 2])
    return s["a"]


@rf.function
def copies(s):
    s += "Story:"
    with s.copy() as c:
        c += rf.gen("x", max_tokens=3)
    s += " end"


def test_python_set_variables_copy_blocks_and_the_return_value_as_a_graph(backend):
    """`s[name] = v` was lost in graph mode (KeyError after the run), `with s.copy() as c:` (SGLang's copy, a fork of
    one joined on exit) was a TypeError, and there was no `ret_value` (SGLang's): fuzzing, session 28."""
    graph, eager = graph_and_eager(sets_variables, backend)
    for key in ("k", "copy", "n"):
        assert graph[key] == eager[key]
    assert graph["copy"] == graph["a"] == graph.ret_value == eager.ret_value and graph["n"] == [1, 2]
    graph, eager = graph_and_eager(copies, backend)
    assert graph.text() == eager.text() == "Story: end" and graph["x"] == eager["x"] and len(graph["x"]) == 1
    with pytest.raises(rf.ProgramError, match="only s.copy"):
        with graph:
            pass


@rf.function
def keeps_values(s, q):
    s += q + rf.gen("a", max_tokens=3)
    s["b"] = s["a"]  # the first a: the replay sets it where it stands
    s.set_var("lst", [1, {"x": s["a"]}])
    s += "\n1, 2, 3," + rf.gen("a", max_tokens=3)
    return s["a"], 1


@rf.function
def reads_an_old_value(s, q):
    s += q + rf.gen("a", max_tokens=3)
    old = s["a"]
    s += "\n1, 2, 3," + rf.gen("a", max_tokens=3)
    s["k"] = old  # a placeholder names its variable: it must not stand for the new a (review)
    return old


@rf.function
def changes_a_value_after_setting_it(s, q):
    s["lst"] = []
    s += q + rf.gen("a", max_tokens=3)
    s["lst"].append(s["a"] + "!")


@rf.function
def returns_itself(s, q):
    s += q + rf.gen("a", max_tokens=3)
    return s


@rf.function
def returns_a_pair(s, q):
    s += q + rf.gen("a", max_tokens=3)
    s["first"] = [s["a"]]
    s += "\nAgain:" + rf.gen("a", max_tokens=3)
    return {"a": s["a"], "n": 1}


def test_kept_values_match_eager_through_templates_aliases_and_containers(backend):
    """Review of session 28's first fix: b = a then a regenerated put the new a where b was read (graph mode); the
    values a template's calls shared were one object (a list appended to in one run showed in the next); `return s`
    gave the trace's own state; a tuple of generated values now stays in graph mode, resolved."""
    for q in ("Hi", "Yo"):
        auto, eager = graph_and_eager(keeps_values, backend, q=q)
        assert auto.text() == eager.text() and auto["b"] == eager["b"] != eager["a"] and auto["lst"] == eager["lst"]
        assert auto.ret_value == eager.ret_value == (eager["a"], 1)
        auto["lst"].append(99)  # must not reach the next call's value
    for program in (reads_an_old_value, changes_a_value_after_setting_it):  # only eager mode has these values
        auto = program.run(q="Hi", backend=backend, **GREEDY)
        eager = program.run(q="Hi", backend=backend, mode="eager", **GREEDY)
        assert auto.mode == "eager" and auto.ret_value == eager.ret_value
        assert auto.get_var("k" if "k" in eager else "lst") == eager.get_var("k" if "k" in eager else "lst")
    state = returns_itself.run(q="Hi", backend=backend, **GREEDY)
    assert state.mode == "graph" and state.ret_value is state and state.ret_value["a"]
    graph, eager = graph_and_eager(returns_a_pair, backend, q="Hi")
    assert graph.ret_value == eager.ret_value == {"a": eager["a"], "n": 1} and graph["first"] == eager["first"]


@rf.function
def reprs_a_value(s):
    s += "Hi" + rf.gen("a", max_tokens=3)
    s += f" again:{s['a']!r}" + rf.gen("b", max_tokens=3)


@rf.function
def parses_with_a_fallback(s):
    s += "Q: 2+2=" + rf.gen("n", max_tokens=2, regex="[0-9]")
    try:
        x = int(s["n"])
    except Exception:
        x = 0
    s += f"\nDouble: {2 * x}."


@rf.function
def branches_on_str_of_a_value(s):
    s += "Say nothing." + rf.gen("v", max_tokens=4, stop=["\n", " ", "."])  # "" where the first token stops it
    s += " NONEMPTY" if str(s["v"]).strip() else " EMPTY"
    s += " len=" + str(len(str(s["v"])))
    try:
        s += f" n={int(str(s['v']))}"
    except ValueError:
        s += " n=?"


@rf.function
def returns_built_text(s):
    s += "Hi" + rf.gen("a", max_tokens=3)
    return s["a"] + "!"


@pytest.mark.parametrize("program", [reprs_a_value, parses_with_a_fallback, branches_on_str_of_a_value, returns_built_text])
def test_values_only_eager_mode_has_make_the_program_eager(backend, program):
    """repr() of a generated value put the placeholder's own repr into the prompt, and a broad `except` around
    int(s["n"]) took its fallback branch while tracing, so graph mode ran another program (fuzzing, session 28); so
    did str(value).strip(), len(str(value)) and int(str(value)), str() being the placeholder's marked text (fuzzing,
    session 29); a return value built from a generated one exists only in eager mode. Each now runs eagerly, as eager
    mode would."""
    auto = program.run(backend=backend, **GREEDY)
    eager = program.run(backend=backend, mode="eager", **GREEDY)
    assert auto.mode == "eager" and auto.text() == eager.text() and auto.ret_value == eager.ret_value
    with pytest.raises(NotTraceable):
        program.trace()


@rf.function
def echo_gen(s, q, t=0.0):
    s += q + rf.gen("a", max_tokens=3, temperature=t)


@pytest.mark.parametrize("mode", ["auto", "eager"])
def test_run_batch_keeps_the_programs_the_backend_did_not_fail(backend, mode, monkeypatch):
    """One program over the context or with a refused parameter failed the whole run_batch, its good programs' states
    lost (fuzzing, session 28). As in SGLang, each program keeps its own outcome: the failed one's error() says why
    and reading its variables raises it. The graphs go to the Engine in one call, the refused ones apart (they were
    all run again one at a time to find the refused one)."""
    calls = []
    for name in ("run_graphs", "run_prepared"):
        monkeypatch.setattr(backend, name, _counted(getattr(backend, name), calls))
    states = echo_gen.run_batch([{"q": "Hi"}, {"q": "x " * 9000}, {"q": "Hi", "t": -1.0}, {"q": "Yo"}],
                                backend=backend, mode=mode, progress_bar=False)
    assert calls == ([] if mode == "eager" else [4])
    alone = echo_gen.run(q="Yo", backend=backend, mode=mode)
    assert [s.error() is None for s in states] == [True, False, False, True]
    assert states[3]["a"] == alone["a"] and "context length" in str(states[1].error())
    assert "temperature must be >= 0" in str(states[2].error())
    with pytest.raises(rf.ProgramError):
        states[2]["a"]
    streamed = list(echo_gen.run_batch([{"q": "Hi"}, {"q": "x " * 9000}], backend=backend, mode=mode,
                                       progress_bar=False, generator_style=True))
    assert [s.error() is None for s in streamed] == [True, False]


def _counted(method, calls: list):
    def counted(programs, *args, **kwargs):
        calls.append(len(programs))
        return method(programs, *args, **kwargs)

    return counted


@rf.function
def sky_logprobs(s):
    s += "The sky is" + rf.gen("v", max_tokens=3, return_logprob=True, top_logprobs_num=2)


def test_gen_logprobs_have_one_shape_in_graph_and_eager_mode(backend):
    """Eager mode on an Engine put token text in the logprob entries (Engine.generate's default) and input logprob
    lists the graph's meta lacked (fuzzing, session 29): each path now gives /generate's shape."""
    graph, eager = graph_and_eager(sky_logprobs, backend)
    g, e = graph.get_meta_info("v"), eager.get_meta_info("v")
    keys = ["input_token_logprobs", "input_top_logprobs", "output_token_logprobs", "output_top_logprobs"]
    assert [g[k] == [] for k in keys[:2]] == [e[k] == [] for k in keys[:2]] == [True, True]
    assert [t[1:] for t in g["output_token_logprobs"]] == [t[1:] for t in e["output_token_logprobs"]]
    assert all(t[2] is None for t in e["output_token_logprobs"]) and len(g["output_top_logprobs"][0]) == 2


def test_a_busy_backend_fails_a_program_alike_in_every_mode(backend, monkeypatch):
    """ServerBusyError came out of a graph-mode run() bare, while eager mode and a streamed graph wrap it in a
    GenerationError (review, session 29): now every mode raises GenerationError, the busy error its cause."""
    from radixflow import ServerBusyError

    def busy(*args, **kwargs):
        raise ServerBusyError("the grammar compile workers are busy; retry later")

    for name in ("run_graphs", "run_prepared", "run_graph_stream", "generate"):
        monkeypatch.setattr(backend, name, busy)

    @rf.function
    def ask(s):
        s += "Q: hi\nA:" + rf.gen("y", max_tokens=2)

    for mode in ("graph", "eager"):
        with pytest.raises(GenerationError, match="busy") as failed:
            ask.run(backend=backend, mode=mode)
        assert isinstance(failed.value.__cause__, ServerBusyError), mode
    with pytest.raises(GenerationError, match="busy"):
        ask.run(backend=backend, stream=True).sync()


def test_run_batch_keeps_a_batch_whose_program_selects_after_nothing_in_every_mode(backend):
    """A select with an empty prompt failed a graph with a GenerationError (the batch kept the others) but raised a
    plain ProgramError eagerly, which lost the whole batch (fuzzing, session 30). A streamed graph whose program
    returns its state gave back an internal copy as ret_value."""
    @rf.function
    def pick(s, prefix):
        s += prefix + rf.select("c", [" yes", " no"])

    for mode in ("auto", "eager"):
        batch = [{"prefix": "Is the sky blue?"}, {"prefix": ""}]
        for states in (pick.run_batch(batch, mode=mode, backend=backend),
                       list(pick.run_batch(batch, mode=mode, backend=backend, generator_style=True))):
            assert states[0].error() is None and states[0]["c"] in (" yes", " no")
            assert isinstance(states[1].error(), GenerationError), (mode, states[1].error())

    @rf.function
    def itself(s):
        s += "Q:" + rf.gen("x", max_tokens=2)
        return s

    streamed = itself.run(stream=True, backend=backend, temperature=0)
    streamed.sync()
    assert streamed.mode == "graph" and streamed.ret_value is streamed


def test_appending_to_a_joined_branch_is_an_error_in_every_mode(backend):
    """After join, eager mode dropped a branch's further text while a graph folded it into the join (a concatenating
    join took the late gen into the parent's text: fuzzing, session 30); SGLang's client hangs there. It is an error."""
    @rf.function
    def late(s, join_mode):
        s += "Word:"
        forks = s.fork(2)
        forks += lambda i: f" [{i}]"
        forks.join(join_mode)
        forks += " LATE" + rf.gen("x", max_tokens=2)

    for join_mode in ("gather_variable", "concate_and_append"):
        for mode in ("auto", "eager"):
            with pytest.raises(ProgramError, match="already joined"):
                late.run(join_mode, backend=backend, mode=mode)


def test_join_gathers_as_sglang_new_variables_of_the_branches_that_set_them(backend):
    """SGLang's join gathers only the variables the parent did not have, each from the branches that set it. Graph
    and eager mode both turned a parent variable one branch set again into a list (the other branch's entry the
    parent's value) and padded a variable set in one branch with None (fuzzing, session 30)."""
    @rf.function
    def p(s):
        s += "Word:" + rf.gen("x", max_tokens=2)
        forks = s.fork(2)
        forks[0] += " again" + rf.gen("x", max_tokens=2)  # the parent's variable, set again in branch 0
        forks[1] += " new" + rf.gen("y", max_tokens=2)  # a new one, in branch 1 only
        forks.join()
        s += " then" + rf.gen("z", max_tokens=2)

    states = [p.run(backend=backend, mode=mode, temperature=0) for mode in ("auto", "eager")]
    assert states[0].mode == "graph"
    for st in states:
        assert isinstance(st["x"], str) and isinstance(st["y"], list) and len(st["y"]) == 1
        assert st.get_meta_info("y")["forks"][0] is not None
    assert states[0].variables() == states[1].variables()


def test_a_parent_variable_set_between_fork_and_join_stays_readable_in_a_graph(backend):
    """The parent keeps a variable it set after the fork, though a branch set it too (SGLang's join), but lowering
    decided at the fork what the join gathers, so a later read of it refused graph mode (review, session 31)."""
    @rf.function
    def p(s):
        s += "Colors: red"
        forks = s.fork(2)
        forks += rf.gen("x", max_tokens=2)
        s += "," + rf.gen("x", max_tokens=2)
        forks.join()
        s += " and" + s["x"] + rf.gen("y", max_tokens=2)

    graph, eager = (p.run(backend=backend, mode=mode, temperature=0) for mode in ("graph", "eager"))
    assert graph.mode == "graph" and isinstance(graph["x"], str)
    assert graph.variables() == eager.variables() and graph.text() == eager.text()


def test_a_prefill_only_gen_runs_as_a_graph_with_eager_modes_meta(backend):
    """gen(max_tokens=0) (SGLang: prefill only, "") was refused in a request graph, so auto mode failed a program
    eager mode ran; and a graph's gen meta_info lacked eager's id, num_retractions and e2e_latency (fuzzing,
    session 30)."""
    @rf.function
    def p(s):
        s += "The capital of France is" + rf.gen("a", max_tokens=0) + "." + rf.gen("b", max_tokens=2)
        s += " Next" + rf.gen("c", max_tokens=0, n=2) + rf.gen("d", max_tokens=0, return_logprob=True)

    graph, eager = (p.run(backend=backend, mode=mode, temperature=0) for mode in ("auto", "eager"))
    assert graph.mode == "graph" and graph.variables() == eager.variables() and graph.text() == eager.text()
    assert graph["a"] == "" and graph["c"] == ["", ""]
    for name in "abd":
        assert set(eager.get_meta_info(name)) <= set(graph.get_meta_info(name)), name
    assert graph.get_meta_info("a")["finish_reason"] == {"type": "length", "length": 0}


def test_reading_an_n_samples_variable_into_the_text_fails_as_in_eager_mode(backend):
    """gen(n=2)'s variable is a list: eager mode cannot append it (a TypeError, as in SGLang), while a request graph
    put str(list) into the model's prompt (fuzzing, session 30). The graph now refuses it, and auto mode runs the
    program eagerly, with eager mode's error."""
    @rf.function
    def p(s):
        s += "Count: 1, 2, 3," + rf.gen("a", max_tokens=3, n=2)
        s += " | again:" + s["a"] + rf.gen("b", max_tokens=2)

    with pytest.raises(NotTraceable):
        p.run(backend=backend, mode="graph", temperature=0)
    for mode in ("auto", "eager"):
        with pytest.raises(TypeError):
            p.run(backend=backend, mode=mode, temperature=0)


def test_an_eager_stream_shows_a_gens_text_as_it_grows(backend):
    """An eager stream held back a gen's last 32 characters whatever its stops, so a short gen arrived in one chunk
    at its end while a graph streamed it token by token (fuzzing, session 30). Only a possible stop's start is held
    back now; the chunks still join to the final text, cut at the stop."""
    @rf.function
    def p(s, stop):
        s += "Count: 1, 2, 3," + rf.gen("a", max_tokens=16, stop=stop)

    for stop in (None, " 9", ["zz", " 7,"]):
        state = p.run(stop, backend=backend, mode="eager", stream=True, temperature=0)
        chunks = list(state.text_iter("a"))
        assert state.mode == "eager" and "".join(chunks) == state["a"]
        assert len([c for c in chunks if c]) > 3, chunks


def test_run_takes_sglangs_n_and_logprob_keywords_for_every_gen(backend):
    """SGLang's run() and run_batch() take n, return_logprob, logprob_start_len, top_logprobs_num and
    return_text_in_logprobs as every gen's defaults, and run() use_thread; a tuple appended to forks is one expression
    a branch. All were TypeErrors (fuzzing, session 30)."""
    @rf.function
    def p(s):
        s += "Count: 1, 2, 3," + rf.gen("a", max_tokens=3) + rf.gen("b", max_tokens=2, top_logprobs_num=0)

    for mode in ("auto", "eager"):
        st = p.run(backend=backend, mode=mode, temperature=0, return_logprob=True, top_logprobs_num=2, use_thread=False)
        assert len(st.get_meta_info("a")["output_top_logprobs"][0]) == 2
        assert not any(st.get_meta_info("b").get("output_top_logprobs") or [])  # the gen's own value wins
        assert p.run(backend=backend, mode=mode, temperature=0, n=2)["a"] == [" 4,", " 4,"]
    states = p.run_batch([{}, {}], backend=backend, temperature=0, return_logprob=True)
    assert all(len(st.get_meta_info("a")["output_token_logprobs"]) == 3 for st in states)

    @rf.function
    def q(s):
        s += "A:"
        forks = s.fork(2)
        forks += (" x", " y")
        forks += rf.gen("z", max_tokens=1)
        forks.join("concate_and_append")

    st = q.run(backend=backend, temperature=0)
    assert st.text().startswith("A: x") and " y" in st.text() and len(st["z"]) == 2


def test_streamed_chunks_carry_meta_info_in_every_mode(backend):
    """text_async_iter(var, return_meta_data=True): a graph's chunks of a gen without logprobs carried None where
    eager mode's carried the gen's meta_info, and a select's carried None in both (SGLang gives its meta_info:
    fuzzing, session 30)."""
    import asyncio

    @rf.function
    def p(s):
        s += "Sky:" + rf.select("c", [" blue", " red"]) + "." + rf.gen("h", max_tokens=3)

    async def chunks(mode, var):
        state = p.run(stream=True, backend=backend, temperature=0, mode=mode)
        return state, [item async for item in state.text_async_iter(var, return_meta_data=True)]

    for mode in ("auto", "eager"):
        state, gen_chunks = asyncio.run(chunks(mode, "h"))
        assert "".join(d for d, _ in gen_chunks) == state["h"] and all(isinstance(m, dict) for _, m in gen_chunks)
        assert gen_chunks[-1][1]["finish_reason"]["type"] == "length"
        state, select_chunks = asyncio.run(chunks(mode, "c"))
        assert [d for d, _ in select_chunks] == [state["c"]]
        assert select_chunks[0][1]["normalized_prompt_logprobs"] == state.get_meta_info("c")["normalized_prompt_logprobs"]
