"""radixflow: a serving system for LLM programs."""

import os as _os
import sys as _sys

# OpenMP workers that spin between torch's parallel regions steal the cores from the thread
# running the engine whenever other processes load the machine (README: "CPU threads").
# libgomp reads this once, when torch loads; an explicit setting wins.
if "torch" not in _sys.modules:
    _os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from radixflow.errors import GrammarError, ModelPathError, RadixflowError, ServerBusyError
from radixflow.runtime.server_args import ServerArgs
from radixflow.version import __version__  # noqa: F401 (re-exported)


_LANG = {  # the frontend DSL, imported on first use
    **{n: "radixflow.lang" for n in ("function", "gen", "gen_int", "gen_string", "select", "system", "user")},
    **{n: "radixflow.lang" for n in ("assistant", "set_default_backend", "flush_cache", "get_server_info")},
    **{n: "radixflow.lang" for n in ("token_length_normalized", "greedy_token_selection", "ProgramState")},
    **{n: "radixflow.lang" for n in ("unconditional_likelihood_normalized", "ProgramError", "global_config")},
    **{n: "radixflow.lang" for n in ("system_begin", "system_end", "user_begin", "user_end", "assistant_begin")},
    **{n: "radixflow.lang" for n in ("assistant_end", "image", "video", "separate_reasoning")},
    **{n: "radixflow.lang" for n in ("unconditional_likelihood_normalized", "ProgramError")},
    **{n: "radixflow.lang" for n in ("tool_call", "tools_prompt", "tool_result", "parse_tool_calls", "ToolCall")},
    "Runtime": "radixflow.lang.backends.runtime",
    "RuntimeEndpoint": "radixflow.lang.backends.runtime_endpoint",
    "OpenAIEndpoint": "radixflow.lang.backends.openai_endpoint",
}


def __getattr__(name):  # heavy imports (torch, transformers) only when used
    if name == "Engine":
        from radixflow.runtime.engine import Engine

        return Engine
    if name in _LANG:
        import importlib

        return getattr(importlib.import_module(_LANG[name]), name)
    if name in _SGLANG_BACKENDS:  # SGLang's API backends: one class here serves every OpenAI-compatible server
        raise AttributeError(f"radixflow has no {name} backend; use rf.OpenAIEndpoint(base_url, model=..., "
                             "api_key=...) for any OpenAI-compatible server (docs/programs.md, backends)")
    raise AttributeError(f"module 'radixflow' has no attribute {name!r}")


_SGLANG_BACKENDS = ("OpenAI", "Anthropic", "LiteLLM", "VertexAI", "Crusoe")


__all__ = ["Engine", "ServerArgs", "RadixflowError", "ServerBusyError", "ModelPathError", "GrammarError", *_LANG]
