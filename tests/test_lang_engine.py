"""LLM programs on the real default model, in-process (Engine backend): request graphs
run inside the scheduler and give the same greedy tokens as eager execution."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

import radixflow as rf
from radixflow.runtime.async_threads import iterate_in_thread
from radixflow.lang.backends.engine_backend import EngineBackend

from lang_programs import FEW_SHOT, capital_select, chat_two_turns, concat_story, few_shot_qa, tips

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from agent_tool import calculator_agent, evaluate_arithmetic, format_number  # noqa: E402

GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def backend(engine):
    rf.set_default_backend(engine)
    yield EngineBackend.for_engine(engine)
    rf.set_default_backend(None)


def both(program, **kwargs):
    graph = program.run(**kwargs, **GREEDY)
    eager = program.run(**kwargs, **GREEDY, mode="eager")
    assert graph.mode == "graph" and eager.mode == "eager"
    return graph, eager


def test_few_shot_qa_with_stop_is_one_request_and_matches_eager(backend):
    graph, eager = both(few_shot_qa, question="What is the capital of France?")
    assert graph["answer"] == eager["answer"] == " Paris"
    assert graph.text() == eager.text() == FEW_SHOT + "Q: What is the capital of France?\nA: Paris"
    assert graph.program_meta["num_requests"] == 1
    assert graph.get_meta_info("answer")["finish_reason"]["matched"] == "\n"


def test_multi_turn_chat_messages_follow_the_chat_template(backend, tokenizer):
    graph, eager = both(chat_two_turns, question="What is the capital of France?")
    msgs = graph.messages()
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    assert msgs[0]["content"] == "You are a terse assistant." and msgs[3]["content"] == "And in one word?"
    assert msgs[2]["content"] == graph["first"] and msgs[4]["content"] == graph["second"]
    assert graph.text() == tokenizer.apply_chat_template(msgs, tokenize=False)
    assert graph.text() == eager.text() and msgs == eager.messages()
    # the second gen continued the same request: appended turn tokens, no new admission
    assert graph.program_meta["num_requests"] == 1 and graph.program_meta["continued_segments"] == 1


def test_select_scores_all_choices_and_matches_eager(backend):
    graph, eager = both(capital_select, country="France")
    assert graph["capital"] == eager["capital"] == " Paris"
    meta = graph.get_meta_info("capital")
    assert len(meta["normalized_prompt_logprobs"]) == 3
    assert meta["normalized_prompt_logprobs"] == pytest.approx(eager.get_meta_info("capital")["normalized_prompt_logprobs"], abs=1e-4)
    assert graph.text() == eager.text()
    for method in (rf.greedy_token_selection, rf.unconditional_likelihood_normalized):
        other = capital_select.run(country="France", method=method, **GREEDY)
        assert other.mode == "graph" and other["capital"] == " Paris"
    assert "unconditional_token_logprobs" in other.get_meta_info("capital")


def test_fork_join_gathers_branch_variables(backend):
    graph, eager = both(tips, topic="brewing tea")
    assert isinstance(graph["tip"], list) and len(graph["tip"]) == 3
    assert graph["tip"] == eager["tip"] and graph.text() == eager.text()
    assert "Tip 1:" not in graph.text()  # gather leaves the parent's text as it was
    assert graph.program_meta["num_requests"] == 4  # three branches + the summary


def test_concatenate_and_append_reuses_the_first_branch_kv(backend):
    graph, eager = both(concat_story, name="Ada")
    text = graph.text()
    assert text == eager.text()
    assert text.index("Morning:" + graph["part"][0]) < text.index("Evening:" + graph["part"][1])
    ending = graph.get_meta_info("ending")
    # the continuation's prompt = parent + branch 0 + branch 1; the tree holds parent + branch 0
    assert ending["cached_tokens"] >= ending["prompt_tokens"] - 12


def test_streaming_text_iter_yields_the_generated_text(backend):
    state = few_shot_qa.run(question="What is the capital of Italy?", stream=True, max_new_tokens=8, **GREEDY)
    pieces = list(state.text_iter(var_name="answer"))  # SGLang's keyword
    assert "".join(pieces) == state["answer"] == " Rome"
    whole = "".join(few_shot_qa.run(question="What is the capital of Italy?", stream=True, **GREEDY).text_iter())
    assert whole == state.text()


def test_text_async_iter_streams_many_programs_on_one_event_loop(backend, monkeypatch):
    """Each stream's deltas add up to its variable, several at once on one loop; a consumer that stops early leaves
    its program to finish. The deltas come through the shared async pool (iterate_in_thread), not the loop's small
    default executor, where each waiting stream held one of its few threads."""
    import radixflow.lang.state as state_module

    pooled = []

    def spy(it):
        pooled.append(it)
        return iterate_in_thread(it)

    monkeypatch.setattr(state_module, "iterate_in_thread", spy)
    questions = [f"What is the capital of {c}?" for c in ("Italy", "France", "Spain")]

    async def joined(q: str, stop_early: bool) -> tuple:
        state = few_shot_qa.run(question=q, stream=True, max_new_tokens=8, **GREEDY)
        pieces = []
        async for delta in state.text_async_iter(var_name="answer"):
            pieces.append(delta)
            if stop_early:
                break
        return state, "".join(pieces)

    async def main() -> list:
        return await asyncio.gather(*(joined(q, i == 0) for i, q in enumerate(questions)))

    results = asyncio.run(main())
    for (state, text), q in zip(results[1:], questions[1:]):
        assert text == state["answer"] == few_shot_qa.run(question=q, max_new_tokens=8, **GREEDY)["answer"]
    first, text = results[0]
    assert first["answer"].startswith(text) and text
    assert len(pooled) == 3


def test_run_batch_of_16_in_order_sharing_the_prefix_kv(backend, engine):
    engine.flush_cache()
    countries = ["France", "Italy", "Japan", "Egypt", "Peru", "Kenya", "Chile", "India"] * 2
    questions = [f"What is the capital of {c}?" for c in countries]
    states = few_shot_qa.run_batch([{"question": q} for q in questions], progress_bar=False, max_new_tokens=4, **GREEDY)
    assert [s.mode for s in states] == ["graph"] * 16
    assert all(s.text().startswith(FEW_SHOT + f"Q: {q}\nA:") for s, q in zip(states, questions))
    assert states[0]["answer"] == " Paris" and states[1]["answer"] == " Rome"
    assert [s["answer"] for s in states[:8]] == [s["answer"] for s in states[8:]]
    assert all(s.program_meta["num_requests"] == 1 for s in states)
    hit = engine.get_server_info()["cache_hit_rate"]
    print(f"run_batch(16) cache hit rate: {hit:.2f}")
    assert hit > 0.5  # the few-shot prefix is computed once and shared


def test_tool_use_program_evaluates_the_expression_in_python(backend):
    assert evaluate_arithmetic("3 * (4 + 5) - 1") == 26 and evaluate_arithmetic("-2*3/4") == -1.5
    for bad in ("__import__('os')", "2 **", "1/0", "3 4"):
        with pytest.raises(ValueError):
            evaluate_arithmetic(bad)
    s = calculator_agent.run(question="A box holds 12 eggs. How many eggs are in 7 boxes?", **GREEDY)
    assert s.mode == "eager"  # the tool reads s["expression"] in Python
    assert s["result"] == format_number(evaluate_arithmetic(s["expression"])) == "84"
    assert "The calculator says 84." in s.messages()[-2]["content"]


@rf.function
def branchy(s, question):
    s += FEW_SHOT + "Q: " + question + "\nA:" + rf.gen("answer", max_tokens=8, stop="\n")
    if s["answer"].strip() == "Paris":
        s += "\nQ: What is the capital of Italy?\nA:" + rf.gen("next", max_tokens=8, stop="\n")
    else:
        s += "\nQ: Are you sure?\nA:" + rf.gen("next", max_tokens=8, stop="\n")


def test_data_dependent_control_flow_falls_back_to_eager(backend, engine):
    with pytest.raises(rf.lang.NotTraceable):
        branchy.trace(question="What is the capital of France?")
    with pytest.raises(rf.lang.NotTraceable, match="use mode='auto'"):  # says what to change
        branchy.run(question="What is the capital of France?", mode="graph", **GREEDY)
    with pytest.raises(AttributeError, match="use rf.OpenAIEndpoint"):  # SGLang's API backend classes
        rf.OpenAI("gpt-4o")
    s = branchy.run(question="What is the capital of France?", **GREEDY)
    assert s.mode == "eager" and s["answer"] == " Paris" and s["next"] == " Rome"
    ref = engine.generate(s.text()[: -len(s["next"])], {"max_new_tokens": 8, "stop": "\n", **GREEDY})
    assert ref["text"] == s["next"]


def test_errors_name_the_program_variable(backend):
    @rf.function
    def bad(s):
        s += "Hi" + rf.gen("greeting", max_tokens=4, top_p=5.0)

    for mode in ("graph", "eager"):
        with pytest.raises(rf.ProgramError, match="greeting"):
            bad.run(mode=mode)


def test_a_select_with_nothing_before_it_is_refused_in_both_modes(backend):
    """Found by fuzzing: with no text before it every choice scored 0 and the first always won."""

    @rf.function
    def pick(s):
        s += rf.select("c", choices=["no", "yes"])

    for mode in ("graph", "eager"):
        with pytest.raises(rf.ProgramError, match="some text before its first gen or select"):
            pick.run(mode=mode)


def test_arguments_may_hold_any_character(backend):
    """Placeholders are bracketed by a per-process random mark: an argument holding the old mark's character
    (U+001F) failed every mode with a DataDependentError (found by fuzzing)."""

    @rf.function
    def qa(s, q):
        s += f"Q: {q}\nA:" + rf.gen("a", max_tokens=3, temperature=0)
        s += " so " + s["a"] + rf.gen("b", max_tokens=2, temperature=0)

    texts = {mode: qa.run(q="a\x1fb", mode=mode).text() for mode in ("eager", "graph", "auto")}
    assert texts["eager"].startswith("Q: a\x1fb\nA:") and len(set(texts.values())) == 1, texts


def test_inputs_that_are_not_text_are_refused_by_name(backend, engine):
    """Found by fuzzing: a lone surrogate raised tokenizers' TypeError about its input types, and select's choices
    given as one string ran as its characters."""
    with pytest.raises(rf.RadixflowError, match="lone surrogate"):
        engine.generate("a\udcff", {"max_new_tokens": 2})

    @rf.function
    def ask(s, q):
        s += "Q: " + q + rf.gen("a", max_tokens=2)

    for mode in ("eager", "graph"):
        with pytest.raises(rf.RadixflowError, match="lone surrogate"):
            ask.run(q="x\udcff", mode=mode)
    with pytest.raises(rf.RadixflowError, match="choices must be a non-empty list"):
        rf.select("c", "ab")


def test_a_text_only_program_runs_in_every_mode(backend, engine):
    """Found by fuzzing: graph and auto modes refused a program with no gen ("use /generate for plain text");
    SGLang runs it, and so does eager mode: nothing is sent, the text is the result."""

    @rf.function
    def greet(s, who):
        s += "hello " + who

    assert {mode: greet.run(who="w", mode=mode).text() for mode in ("eager", "graph", "auto")} == dict.fromkeys(
        ("eager", "graph", "auto"), "hello w")
    with pytest.raises(rf.RadixflowError, match="the same rid twice"):  # results told apart by position only
        engine.generate(["a", "b"], {"max_new_tokens": 1}, rid=["x", "x"])


def test_gen_regex_and_dtype_pass_through_as_constraints(backend):
    pytest.importorskip("radixflow.constrained.backend", reason="constrained decoding not available")

    @rf.function
    def typed(s):
        s += "Q: How many legs does a cat have?\nA:" + rf.gen_int("legs", max_tokens=4)
        s += "\nQ: Name it in capitals.\nA: " + rf.gen("caps", regex="[A-Z]{2,5}", max_tokens=6)

    graph, eager = both(typed)
    assert graph["legs"].lstrip("-").isdigit() and graph["caps"].isupper()
    assert graph.text() == eager.text()


def test_gen_int_ends_at_its_stop_as_in_sglang(backend):
    """dtype int / float add the stops " " and "\\n" (as SGLang does); the regex must let the
    number end with one of them, or the model can only go on writing digits."""
    pytest.importorskip("radixflow.constrained.backend", reason="constrained decoding not available")

    @rf.function
    def count(s):
        s += "Count: 1, 2, 3," + rf.gen_int("n", max_tokens=8) + "\n"

    graph, eager = both(count)
    assert graph["n"] == eager["n"] and graph["n"].strip().isdigit() and graph["n"] == graph["n"].strip()
    assert graph.get_meta_info("n")["finish_reason"]["matched"] in (" ", "\n")


def test_gen_stop_regex_ends_the_gen_in_graph_and_eager_alike(backend):
    @rf.function
    def colors(s):
        s += "List three colors, one per line:\n1." + rf.gen("first", max_tokens=24, stop_regex=r"\n\d") + " and so on."

    graph, eager = both(colors)
    assert graph["first"] == eager["first"] and graph.text() == eager.text()
    assert graph["first"].endswith("\n2"), graph["first"]  # the matched text stays, as in SGLang
    assert graph.get_meta_info("first")["finish_reason"] == {"type": "stop", "matched": r"\n\d"}

    @rf.function
    def plain(s):
        s += "List three colors, one per line:\n1." + rf.gen("first", max_tokens=24) + " and so on."

    assert plain.run(stop_regex=r"\n\d", **GREEDY)["first"] == graph["first"]  # run()'s default for every gen
    with pytest.raises(rf.RadixflowError, match="not a valid regular expression"):
        plain.run(stop_regex="(", **GREEDY)


def test_a_user_defined_backend_has_token_usage(backend):
    """Every backend has token_usage, also one a user writes on the Backend base (here one that
    hands request graphs to the Engine's)."""
    from radixflow.lang.backends.base import Backend

    class GraphsOnly(Backend):
        supports_graphs = True

        def __init__(self, inner):
            self.inner, self.tokenizer = inner, inner.tokenizer

        def run_graphs(self, programs, on_result=None):
            return self.inner.run_graphs(programs, on_result=on_result)

    mine = GraphsOnly(backend)
    state = few_shot_qa.run(backend=mine, question="What is 2 + 2?", **GREEDY)
    assert state.mode == "graph" and mine.token_usage is mine.token_usage
    assert mine.token_usage.completion_tokens == state.get_meta_info("answer")["completion_tokens"] > 0
