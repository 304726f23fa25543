"""The frontend DSL: LLM programs as Python functions over a state `s`.

    @rf.function
    def qa(s, question):
        s += "Q: " + question + "\nA:" + rf.gen("answer", max_tokens=32, stop="\n")

    state = qa.run(question="...", backend=rf.Engine())   # or rf.Runtime(), rf.RuntimeEndpoint(url)

run() traces the program first. A static program (no generated value used in Python)
becomes a request graph, submitted whole (Engine.run_program / POST /program) and run
inside the scheduler; otherwise it runs eagerly, one call per gen (state.mode says which).

Tokenization boundaries: a program's tokens are its pieces tokenized separately: the
text between two model calls as one piece, each gen's own generated ids (stop string /
EOS trimmed), each select's chosen option. So generated " Paris" followed by the text
"." gives [" Paris"] + ["."] even where reading "Paris." at once would merge them. Eager
runs on Engine / RuntimeEndpoint send token ids built by the same rule, so graph and
eager give identical greedy tokens. OpenAIEndpoint sends text, which the server
re-tokenizes as a whole. See radixflow/runtime/programs/segment_tokens.py.
"""

from radixflow.lang.backends import flush_cache, get_server_info, global_config, set_default_backend
from radixflow.lang.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixflow.lang.errors import GenerationError, NotTraceable, ProgramError
from radixflow.lang.function import Function, function
from radixflow.lang.ir import Graph
from radixflow.lang.primitives import (
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    gen_int,
    gen_string,
    image,
    select,
    separate_reasoning,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
    video,
)
from radixflow.lang.state import ProgramState
from radixflow.lang.tools import ToolCall, parse_tool_calls, tool_call, tool_result, tools_prompt

__all__ = [
    "function",
    "Function",
    "gen",
    "gen_int",
    "gen_string",
    "select",
    "system",
    "user",
    "assistant",
    "system_begin",
    "system_end",
    "user_begin",
    "user_end",
    "assistant_begin",
    "assistant_end",
    "image",
    "video",
    "separate_reasoning",
    "global_config",
    "set_default_backend",
    "flush_cache",
    "get_server_info",
    "token_length_normalized",
    "greedy_token_selection",
    "unconditional_likelihood_normalized",
    "ProgramState",
    "ProgramError",
    "GenerationError",
    "NotTraceable",
    "Graph",
    "tool_call",
    "tools_prompt",
    "tool_result",
    "parse_tool_calls",
    "ToolCall",
]
