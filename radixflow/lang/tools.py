"""Tool calls in LLM programs: `rf.tool_call` decodes a call under the grammar of the tools'
schemas (the generic `<tool_call>` format of the OpenAI API), and `s.tool_calls(name)` reads
it back as ToolCall(name, arguments).

    s += rf.system(rf.tools_prompt(TOOLS)) + rf.user(question)
    s += rf.assistant(rf.tool_call("call", TOOLS))
    call = s.tool_calls("call")[0]          # ToolCall("get_weather", {"city": "Paris"})

The variable holds the call's text, as any gen's, so graph and eager runs see the same tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from radixflow.errors import RadixflowError
from radixflow.lang.ir import Gen
from radixflow.lang.primitives import gen
from radixflow.runtime.server.tool_formats import FORMATS, parse
from radixflow.runtime.server.tool_request import grammar, parse_tool_choice, parse_tools, tool_response, tools_instructions

FORMAT = FORMATS["generic"]


@dataclass
class ToolCall:
    name: str
    arguments: dict


def tool_call(name: str, tools: list, function: Optional[str] = None, parallel: bool = False,
              max_tokens: int = 256, **gen_kwargs: Any) -> Gen:  # fmt: skip
    """A gen whose output is one call (several when `parallel`) of one of `tools` (OpenAI
    function definitions), or of `function` when given, with arguments valid for its schema."""
    parsed = parse_tools(tools)
    if not parsed:
        raise RadixflowError(f"tool_call {name!r}: give at least one tool")
    choice = {"type": "function", "function": {"name": function}} if function is not None else "required"
    mode, named = parse_tool_choice(choice, parsed)
    regex = grammar(parsed, FORMAT, mode, named, parallel)
    return gen(name, max_tokens=max_tokens, regex=regex, **gen_kwargs)


def tools_prompt(tools: list) -> str:
    """The instructions that list `tools` and show the call syntax (for a system message)."""
    return tools_instructions(parse_tools(tools), FORMAT)


def parse_tool_calls(text: str) -> list:
    """The complete calls in a tool_call's text (none if max_tokens cut the first one)."""
    return [ToolCall(c.name, json.loads(c.arguments)) for c in parse(text, FORMAT, final=True).calls if c.complete]


def tool_result(content: Any) -> str:
    """A tool's result as the generic format hands it back (for a user message)."""
    return tool_response(content if isinstance(content, str) else json.dumps(content))
