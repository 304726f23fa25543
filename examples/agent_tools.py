"""An agent with OpenAI-style tools in an LLM program: the model picks a function and its
arguments with rf.tool_call (decoded under the functions' JSON schemas, so the call always
parses and validates), Python runs it, and the result goes back into the conversation for
the final answer. Reading the call in Python makes the program data-dependent (eager mode);
`pick_tool` alone is static and runs as one request graph.

    python examples/agent_tools.py
"""

from __future__ import annotations

import radixflow as rf

WEATHER = {"Paris": {"temperature_c": 21, "sky": "sunny"}, "Oslo": {"temperature_c": 4, "sky": "rain"}}
POPULATION = {"Paris": 2_100_000, "Oslo": 710_000}
CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": sorted(WEATHER)}}, "required": ["city"],
        "additionalProperties": False}  # fmt: skip
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Today's weather in a city", "parameters": CITY}},
    {"type": "function", "function": {"name": "get_population", "description": "How many people live in a city", "parameters": CITY}},
]
FUNCTIONS = {
    "get_weather": lambda city: WEATHER[city],
    "get_population": lambda city: {"population": POPULATION[city]},
}


@rf.function
def pick_tool(s, question):
    s += rf.system(rf.tools_prompt(TOOLS))
    s += rf.user(question)
    s += rf.assistant(rf.tool_call("call", TOOLS, max_tokens=64))


@rf.function
def agent(s, question):
    s += rf.system(rf.tools_prompt(TOOLS))
    s += rf.user(question)
    s += rf.assistant(rf.tool_call("call", TOOLS, max_tokens=64))
    for call in s.tool_calls("call"):  # the model's choice, read in Python: runs eagerly
        s += rf.user(rf.tool_result(FUNCTIONS[call.name](**call.arguments)))
    s += rf.assistant(rf.gen("answer", max_tokens=32, stop="\n"))


def main() -> None:
    with rf.Engine() as engine:
        rf.set_default_backend(engine)
        state = agent.run(question="What is the weather like in Oslo today?", temperature=0)
        for call in state.tool_calls("call"):
            print(f"call: {call.name}({call.arguments}) -> {FUNCTIONS[call.name](**call.arguments)}")
        print("answer:", state["answer"].strip())


if __name__ == "__main__":
    main()
