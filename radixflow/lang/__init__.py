"""The frontend DSL: LLM programs as Python functions over a state `s`."""

from radixflow.lang.backends import flush_cache, get_server_info, set_default_backend
from radixflow.lang.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixflow.lang.errors import NotTraceable, ProgramError
from radixflow.lang.function import Function, function
from radixflow.lang.ir import Graph
from radixflow.lang.primitives import assistant, gen, gen_int, gen_string, select, system, user
from radixflow.lang.state import ProgramState

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
    "set_default_backend",
    "flush_cache",
    "get_server_info",
    "token_length_normalized",
    "greedy_token_selection",
    "unconditional_likelihood_normalized",
    "ProgramState",
    "ProgramError",
    "NotTraceable",
    "Graph",
]
