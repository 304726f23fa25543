"""rf.tool_call on the real default model: graph and eager runs give the same valid call, and
the agent example runs its tool and answers."""

from __future__ import annotations

import os
import sys

import jsonschema
import pytest

import radixflow as rf
from radixflow.errors import RadixflowError

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from agent_tools import CITY, FUNCTIONS, TOOLS, agent, pick_tool  # noqa: E402


@pytest.fixture(scope="module")
def backend(engine):
    rf.set_default_backend(engine)
    yield
    rf.set_default_backend(None)


def test_tool_call_graph_and_eager_agree(backend):
    graph = pick_tool.run(question="Is it raining in Oslo?", temperature=0)
    eager = pick_tool.run(question="Is it raining in Oslo?", temperature=0, mode="eager")
    assert graph.mode == "graph" and eager.mode == "eager"
    assert graph["call"] == eager["call"]
    [call] = graph.tool_calls("call")
    assert call.name in FUNCTIONS
    jsonschema.validate(call.arguments, CITY)


def test_named_function_is_the_one_called(backend):
    @rf.function
    def forced(s):
        s += rf.system(rf.tools_prompt(TOOLS)) + rf.user("Tell me about Paris.")
        s += rf.assistant(rf.tool_call("call", TOOLS, function="get_population", temperature=1.0))

    assert [c.name for c in forced.run().tool_calls("call")] == ["get_population"]


def test_agent_example_runs_the_tool_and_answers(backend):
    state = agent.run(question="What is the weather like in Oslo today?", temperature=0)
    assert state.mode == "eager"
    [call] = state.tool_calls("call")
    result = rf.tool_result(FUNCTIONS[call.name](**call.arguments))
    assert result in state.text() and state["answer"].strip()


def test_bad_tools_are_refused():
    with pytest.raises(RadixflowError, match="used twice"):
        rf.tool_call("call", TOOLS + TOOLS[:1])
    with pytest.raises(RadixflowError, match="not in tools"):
        rf.tool_call("call", TOOLS, function="send_email")
