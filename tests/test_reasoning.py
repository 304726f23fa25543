"""Reasoning text apart from the answer (runtime/reasoning.py) and the DSL's separate_reasoning,
without a model."""

from __future__ import annotations

import random

import pytest

import radixflow as rf
from radixflow.lang.backends.base import Backend
from radixflow.lang.chat_template import ChatTemplate
from radixflow.lang.errors import NotTraceable
from radixflow.lang.interpreter import GenResult
from radixflow.lang.ir import Graph
from radixflow.lang.lowering import lower
from radixflow.runtime.reasoning import FORMATS, ReasoningPlan, get_format, prompt_forces, split

QWEN3, R1, KIMI, MISTRAL = (FORMATS[n] for n in ("qwen3", "deepseek-r1", "kimi", "mistral"))
PLAIN = ChatTemplate.plain()


@pytest.mark.parametrize(
    "text, fmt, want",
    [
        ("<think>plan</think>Answer", QWEN3, ("plan", "Answer", "closed")),
        ("\n <think>plan</think>\n\nAnswer", QWEN3, ("plan", "\n\nAnswer", "closed")),
        ("Answer without thinking", QWEN3, ("", "Answer without thinking", "none")),
        ("Answer <think>late</think> rest", QWEN3, ("", "Answer <think>late</think> rest", "none")),  # only a leading block
        ("<think>cut by max_tokens", QWEN3, ("cut by max_tokens", "", "open")),
        ("<think>plan\n<tool_call>{}</tool_call>", QWEN3, ("plan\n", "<tool_call>{}</tool_call>", "closed")),
        ("plan</think>Answer", R1, ("plan", "Answer", "closed")),  # forced: the template opened the block
        ("<think>plan</think>Answer", R1, ("plan", "Answer", "closed")),  # ... or the model wrote the marker anyway
        ("no end marker", R1, ("no end marker", "", "open")),
        ("\u25c1think\u25b7plan\u25c1/think\u25b7Answer", KIMI, ("plan", "Answer", "closed")),
        ("[THINK]plan[/THINK]Answer", MISTRAL, ("plan", "Answer", "closed")),
    ],
)
def test_split(text, fmt, want):
    s = split(text, fmt)
    assert (s.reasoning, s.content, s.block) == want


def test_prompt_ending_with_the_start_marker_forces_the_block():
    assert prompt_forces(QWEN3, "<|im_start|>assistant\n<think>\n") and not prompt_forces(QWEN3, "assistant\n")
    assert prompt_forces(R1, "anything")
    assert split("plan</think>Answer", QWEN3, forced=True).reasoning == "plan"


def test_unknown_format_names_the_known_ones():
    with pytest.raises(rf.RadixflowError, match="unknown reasoning parser 'o1'; choose one of deepseek-r1, "):
        get_format("o1")
    assert get_format("DeepSeek-R1") is R1


def test_stream_deltas_add_up_to_the_split_of_the_whole_text():
    """Cut anywhere, a stream's deltas add up to the finished text's split, with and without
    stream_reasoning: so it never sent a piece of a marker as text, nor anything it had to take back."""
    rng = random.Random(0)
    pieces = ["<think>", "</think>", "<th", "ink>", "</", "think", ">", "plan ", "\n", " ", "<tool_call>", "<", "A"]
    for _ in range(3000):
        fmt = rng.choice([QWEN3, R1, KIMI, MISTRAL])
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        want = split(text, fmt)
        for stream_reasoning in (True, False):
            st = ReasoningPlan(fmt, fmt.forced, stream_reasoning).stream()
            got = ["", ""]
            for cut in sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, 4))) + [None]:
                r, c = st.delta(text if cut is None else text[:cut], finished=cut is None)
                got[0], got[1] = got[0] + r, got[1] + c
            assert tuple(got) == (want.reasoning, want.content), (text, fmt.name, stream_reasoning)


def test_stream_reasoning_false_sends_the_thinking_in_one_delta():
    st = ReasoningPlan(QWEN3, False, stream_reasoning=False).stream()
    assert st.delta("<think>a b", False) == ("", "")
    assert st.delta("<think>a b c</think>", False) == ("a b c", "")
    assert st.delta("<think>a b c</think>Yes", True) == ("", "Yes")


# -- the DSL -------------------------------------------------------------------------------------------------
class ThinkingBackend(Backend):
    """Answers gen `name` with '<think>why NAME</think>NAME!' (no tokenizer: text only)."""

    def __init__(self):
        self.prompts = []

    def chat_template(self):
        return PLAIN

    def generate(self, prompt, params, node=None):
        self.prompts.append(prompt.text)
        return GenResult(f"<think>why {node.name}</think>{node.name}!", None, {})


@rf.function
def answer_then_more(s):
    s += "Q1:" + rf.separate_reasoning(rf.gen("a"), model_type="qwen3") + "\nQ2:"
    s += rf.gen("b")


@rf.function
def two_in_one(s):
    s += rf.separate_reasoning(rf.gen("a") + " and " + rf.gen("b"), model_type="qwen3") + "."


def test_separate_reasoning_splits_the_variable_and_the_text():
    b = ThinkingBackend()
    st = answer_then_more.run(backend=b)
    assert st["a"] == "a!" and st["a_reasoning_content"] == "why a"
    assert b.prompts[1] == "Q1:a!\nQ2:"  # the next gen does not see the thinking
    assert st.text() == "Q1:a!\nQ2:<think>why b</think>b!"
    st = two_in_one.run(backend=b)  # both outputs of one expression, each in its place
    assert (st["a"], st["b"], st["b_reasoning_content"]) == ("a!", "b!", "why b")
    assert st.text() == "a! and b!."


def test_separate_reasoning_in_a_graph_only_at_a_strand_end():
    graph = answer_then_more.trace()
    assert "separate_reasoning a model_type=qwen3" in str(graph) and "a_reasoning_content" in graph.variables
    assert Graph.from_json(graph.to_json()).to_json() == graph.to_json()
    with pytest.raises(NotTraceable, match="after separate_reasoning"):
        lower(graph, PLAIN, {})
    assert lower(two_in_one.trace(), PLAIN, {})["ops"][-1] == {"op": "text", "text": "."}


def test_separate_reasoning_errors():
    with pytest.raises(rf.RadixflowError, match="needs model_type"):
        rf.separate_reasoning(rf.gen("a"))
    with pytest.raises(rf.RadixflowError, match="unknown reasoning parser"):
        rf.separate_reasoning(rf.gen("a"), model_type="nope")
    with pytest.raises(rf.RadixflowError, match="named gens or selects"):
        rf.separate_reasoning(rf.gen(), model_type="qwen3")
