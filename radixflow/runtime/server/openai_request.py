"""OpenAI request bodies mapped onto the native GenerateInput: the accepted fields,
sampling names, prompts from `prompt` or `messages` (through the chat template), with a
clear error for each bad field. Tools are planned by tool_request.py."""

from __future__ import annotations

import functools
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from radixflow.errors import RadixflowError
from radixflow.runtime import sglang_fields
from radixflow.runtime.generate_request import GenerateInput, grammars_off, token_ids_in
from radixflow.runtime.reasoning import ReasoningPlan, get_format, prompt_forces
from radixflow.runtime.sampling_params import api_names
from radixflow.runtime.server.tokenizer_manager import TokenizerManager
from radixflow.runtime.server.tool_request import ToolPlan, plan_tools

_SAMPLING_FIELDS = api_names("openai")  # OpenAI / SGLang request field -> sampling_params key
# sampling_params key -> the field an OpenAI request sets it with, where the names differ (for error messages)
_OPENAI_NAMES = {"max_new_tokens": "max_tokens", **{v: k for k, v in _SAMPLING_FIELDS.items() if k != v}}
_OPENAI_NAME = re.compile(r"\b(" + "|".join(_OPENAI_NAMES) + r")\b")
_COMMON = set(_SAMPLING_FIELDS) | {"model", "stream", "stream_options", "rid", "response_format", "max_tokens"}
COMPLETION_FIELDS = _COMMON | {"prompt", "logprobs", "echo", "suffix"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
                          "continue_final_message", "add_generation_prompt", "chat_template_kwargs", "separate_reasoning",
                          "stream_reasoning", "reasoning_effort"}  # fmt: skip
_TEMPLATE_ARGS = {"conversation", "messages", "tokenize", "add_generation_prompt", "tools", "continue_final_message",
                  "return_dict", "return_tensors", "tokenizer"}  # fmt: skip
_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass
class Call:
    """One OpenAI call mapped to a native generate call."""

    kind: str  # "completion" | "chat"
    g: GenerateInput
    n: int
    prompts: list  # prompt texts (for echo)
    echo: bool = False
    logprobs: bool = False
    include_usage: bool = False
    continuous_usage: bool = False  # usage so far on every streamed chunk (stream_options.continuous_usage_stats)
    tools: Optional[ToolPlan] = None  # set when the output is decoded and parsed as tool calls
    reasoning: Optional[ReasoningPlan] = None  # set when the thinking is split from the answer (--reasoning-parser)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))


def parse_body(body: Any, allowed: set, sglang_extras: dict, route: str) -> dict:
    if not isinstance(body, dict):
        raise RadixflowError(f"the request body must be a JSON object, got {type(body).__name__}")
    sglang_fields.check_fields(body, allowed, sglang_extras, route)
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise RadixflowError("model must be a string")
    return body


# -- request mapping ---------------------------------------------------------------------------------------------
def openai_names(message: str) -> str:
    """An error message about sampling parameters, in the names an OpenAI request uses (max_tokens, not
    max_new_tokens)."""
    return _OPENAI_NAME.sub(lambda m: _OPENAI_NAMES[m.group(1)], message)


def _sampling(body: dict, max_tokens: Any, defaults: dict) -> dict:
    """The request's sampling parameters; `defaults` (the model's generation_config: --sampling-defaults) fill
    those it leaves out."""
    sp = {**defaults, **{dst: body[src] for src, dst in _SAMPLING_FIELDS.items() if body.get(src) is not None}}
    if max_tokens is not None:
        sp["max_new_tokens"] = max_tokens
    schema = _response_format(body.get("response_format"))
    if schema is not None:
        given = [k for k in ("json_schema", "regex", "ebnf") if body.get(k) is not None]
        if given:  # the request's own grammar would have been replaced unseen
            raise RadixflowError(f"response_format and {', '.join(given)} both constrain the output; send one of them")
        sp["json_schema"] = schema
    return sp


def _check_grammars_on(tm: TokenizerManager, body: dict, sp: dict) -> None:
    """--grammar-backend none: a grammar the request asks for is refused in the request's own terms."""
    kinds = [k for k in ("regex", "json_schema", "ebnf") if sp.get(k) is not None]
    if kinds and tm.args.grammar_backend == "none":
        raise grammars_off(kinds[0] if body.get(kinds[0]) is not None else "response_format")


def _tools_constrained(tm: TokenizerManager, tools: ToolPlan) -> bool:
    """Whether the tool plan's grammar applies: not under --grammar-backend none, where tool_choice auto's calls are
    parsed from unconstrained output (as SGLang's) and a required or named call is refused."""
    if tm.args.grammar_backend != "none":
        return True
    if tools.choice != "auto":
        which = "'required'" if tools.choice == "required" else "naming a function"
        raise RadixflowError(f"tool_choice {which} constrains the output to a tool call, and this server takes "
                             "no grammars (--grammar-backend none): use tool_choice auto, whose calls are parsed "
                             "unconstrained, or start the server with another --grammar-backend")
    return False


def _response_format(rf: Any) -> Optional[str]:
    if rf is None:
        return None
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise RadixflowError("response_format must be an object with a 'type'")
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return json.dumps({"type": "object"})
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise RadixflowError("response_format.json_schema must be an object with a 'schema' object")
        return json.dumps(spec["schema"])
    raise RadixflowError(f"response_format type {kind!r} is not supported; use text, json_object or json_schema")


def flag(body: dict, name: str, default: bool, hint: str = "") -> bool:
    """A true / false field; null (as clients send unset fields) is unset."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RadixflowError(f"{name} must be true or false{hint}")
    return value


def _stream_flags(body: dict, usage_default: bool = False) -> tuple[bool, bool, bool]:
    """(stream, include_usage, continuous_usage_stats); `usage_default`: include_usage where the request does not
    say (--stream-response-default-include-usage). continuous_usage_stats (vLLM's and SGLang's) puts the counts so
    far on every chunk."""
    stream = flag(body, "stream", False)
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise RadixflowError('stream_options must be an object like {"include_usage": true}')
    unknown = sorted(set(opts) - _STREAM_OPTIONS)
    if unknown:
        raise RadixflowError(f"unknown stream_options field(s): {', '.join(unknown)}; accepted: {', '.join(sorted(_STREAM_OPTIONS))}")
    usage, continuous = opts.get("include_usage", usage_default), opts.get("continuous_usage_stats", False)
    if not isinstance(usage, bool) or not isinstance(continuous, bool) or not isinstance(opts.get("include_obfuscation", False), bool):
        raise RadixflowError("stream_options' fields must be true or false")
    return stream, usage, continuous and usage


# include_obfuscation (OpenAI's padding against side channels) is accepted and does nothing
_STREAM_OPTIONS = {"include_usage", "continuous_usage_stats", "include_obfuscation"}


def _n(body: dict) -> int:
    n = body.get("n", 1)
    if n is None:
        return 1
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise RadixflowError(f"n must be an integer >= 1, got {n!r}")
    return n


def completion_call(tm: TokenizerManager, body: dict) -> Call:
    if body.get("suffix"):
        raise RadixflowError("suffix is not supported; put the whole prompt in 'prompt'")
    prompt = body.get("prompt")
    stream, usage, continuous = _stream_flags(body, tm.args.stream_response_default_include_usage)
    text, ids, prompts = _completion_prompt(tm, prompt)
    k = body.get("logprobs")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= 20):
        raise RadixflowError("logprobs must be an integer in [0, 20] (the number of top tokens to return)")
    echo = flag(body, "echo", False)
    max_tokens = body.get("max_tokens", 16)
    sp = _sampling(body, 16 if max_tokens is None else max_tokens, tm.sampling_defaults)
    _check_grammars_on(tm, body, sp)
    g = GenerateInput(text=text, input_ids=ids, sampling_params=sp,
                      rid=body.get("rid"), return_logprob=k is not None, top_logprobs_num=k or 0,
                      logprob_start_len=0 if (echo and k is not None) else None,
                      return_text_in_logprobs=True, stream=stream)  # fmt: skip
    return Call("completion", g, _n(body), prompts, echo, k is not None, usage, continuous_usage=continuous)


def _completion_prompt(tm: TokenizerManager, prompt: Any) -> tuple:
    """(text, input_ids, prompt texts) from a str, list of str, token ids or list of token ids."""
    if isinstance(prompt, str):
        return prompt, None, [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return prompt, None, prompt
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return None, prompt, [tm.tokenizer.decode(_in_vocab(tm, prompt))]
        if all(isinstance(p, list) for p in prompt):
            return None, prompt, [tm.tokenizer.decode(_in_vocab(tm, p)) for p in prompt]
    raise RadixflowError("prompt must be a non-empty string, a list of strings, a list of token ids or a list of those")


def _in_vocab(tm: TokenizerManager, ids: list) -> list:
    """`ids`, checked before they are decoded (the decoder overflows on ids past the vocabulary or below 0)."""
    if not ids or not token_ids_in(ids, tm.info.vocab_size):
        raise RadixflowError(f"a prompt of token ids must be a non-empty list of integers in [0, {tm.info.vocab_size})")
    return ids


def chat_call(tm: TokenizerManager, body: dict) -> Call:
    stream, usage, continuous = _stream_flags(body, tm.args.stream_response_default_include_usage)
    text, tools = _chat_text(tm, body)
    ids = tm.tokenizer.encode(text, add_special_tokens=False)
    want_lp = flag(body, "logprobs", False, " (use top_logprobs for the number of alternatives)")
    top = body.get("top_logprobs")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 20 or not want_lp):
        raise RadixflowError("top_logprobs must be an integer in [0, 20], and needs logprobs: true")
    max_tokens = body.get("max_completion_tokens")  # null, as some clients send unset fields, is unset
    max_tokens = body.get("max_tokens") if max_tokens is None else max_tokens
    if max_tokens is None:  # like OpenAI: up to the context length
        max_tokens = max(min(tm.info.context_len - len(ids), tm.args.max_new_tokens_limit), 0)
    sp = _sampling(body, max_tokens, tm.sampling_defaults)
    _check_grammars_on(tm, body, sp)
    if tools and tools.regex and _tools_constrained(tm, tools):
        sp["regex"] = tools.regex
    g = GenerateInput(input_ids=ids, sampling_params=sp, rid=body.get("rid"), return_logprob=want_lp,
                      top_logprobs_num=top or 0, return_text_in_logprobs=True, stream=stream)  # fmt: skip
    grammar = next((str(sp[k]) for k in ("regex", "json_schema", "ebnf") if sp.get(k) is not None), None)
    whole = None if tools and tools.choice == "auto" else grammar  # auto: free text (thinking too) before any call
    thinks = _think_first(tm, g.sampling_params, text, whole)
    return Call("chat", g, _n(body), [text], False, want_lp, usage, continuous, tools if tools and tools.regex else None,
                _reasoning_plan(tm, body, text, whole, thinks))  # fmt: skip


def _think_first(tm: TokenizerManager, sp: dict, prompt: str, grammar: Optional[str]) -> bool:
    """With a --reasoning-parser, a grammar on the whole output (a schema, a regex, a required tool call) starts
    after the thinking block, as SGLang applies it: `sp`'s grammar becomes the block, then the grammar
    (constrained/after_thinking.py). Not where the grammar writes the end marker itself (it writes the thinking
    too), nor for an ebnf grammar on the outlines backend. True where the grammar was so composed."""
    if not tm.args.reasoning_parser or grammar is None or tm.args.grammar_backend == "none":
        return False  # none: the request builder refuses the grammar
    from radixflow.constrained import validate
    from radixflow.constrained.after_thinking import after_thinking
    from radixflow.constrained.options import GrammarOptions

    fmt, backend = get_format(tm.args.reasoning_parser), tm.args.grammar_backend
    kinds = [k for k in ("regex", "json_schema", "ebnf") if sp.get(k) is not None]
    if len(kinds) != 1 or _writes_marker(grammar, fmt.end) or _special(tm.tokenizer, fmt.end):
        return False  # several grammars: refused later; a special-token marker: grammars never allow one
    kind = kinds[0]
    if not sp[kind] or not (isinstance(sp[kind], str) or (kind == "json_schema" and isinstance(sp[kind], dict))):
        return False  # a bad value: refused later with the usual message (sampling_params)
    validate(kind, sp[kind], backend)  # the request's own grammar: an error names it, not the composition
    options = GrammarOptions(tm.args.constrained_json_whitespace_pattern or None, tm.args.constrained_json_any_depth)
    new_kind, spec = after_thinking(kind, sp[kind], fmt.start, fmt.end, prompt_forces(fmt, prompt), backend, options)
    if spec is sp[kind]:
        return False
    del sp[kind]
    sp[new_kind] = spec
    return True


def _writes_marker(grammar: str, marker: str) -> bool:
    """Whether a grammar writes the thinking block's end `marker` itself (so it writes the thinking too), escaped
    characters included (`\\[/THINK\\]`)."""
    return marker in grammar.replace("\\", "")


@functools.lru_cache(maxsize=8)
def _special(tokenizer, text: str) -> bool:
    """Whether `text` holds a special token of `tokenizer` (the server's one marker: checked once, not per request)."""
    special = set(tokenizer.all_special_ids)
    return any(i in special for i in tokenizer.encode(text, add_special_tokens=False))


def _reasoning_plan(tm: TokenizerManager, body: dict, prompt: str, grammar: Optional[str],
                    thinks_first: bool) -> Optional[ReasoningPlan]:  # fmt: skip
    """Split the thinking out if the server has a --reasoning-parser and the request does not
    say separate_reasoning: false (SGLang's fields; stream_reasoning: false sends the thinking
    in one delta once it ends). A grammar on the whole output that the thinking block does not come
    before (`thinks_first`: _think_first) and that never writes the end marker leaves no room for thinking:
    its output starts inside a block only if it opens one, whatever the format (a deepseek-r1 tool call came
    back as reasoning_content: fuzzing). One that writes the marker writes the thinking too."""
    separate, stream = flag(body, "separate_reasoning", True), flag(body, "stream_reasoning", True)
    if not tm.args.reasoning_parser or not separate:
        return None
    fmt = get_format(tm.args.reasoning_parser)
    thinks = grammar is None or thinks_first or _writes_marker(grammar, fmt.end)
    return ReasoningPlan(fmt, prompt_forces(fmt, prompt) and thinks, stream)


def chat_prompt_text(tm: TokenizerManager, body: dict) -> str:
    """The prompt a chat request renders to, as /tokenize counts it."""
    return _chat_text(tm, body)[0]


def _chat_text(tm: TokenizerManager, body: dict) -> tuple[str, Optional[ToolPlan]]:
    """The prompt of a chat request's `messages` (with its tools, or in the tool format where the messages hold tool
    calls or results: /tokenize rendered those with the plain template and undercounted) and its tool plan."""
    from radixflow.runtime.tokenizer import apply_chat_template

    messages = _messages(body.get("messages"))
    options = _template_options(body, messages)
    tools = plan_tools(body, messages, tm.tokenizer, tm.args.tool_call_parser, options)
    return (tools.prompt if tools else apply_chat_template(tm.tokenizer, messages, **options)), tools


def _template_options(body: dict, messages: list) -> dict:
    """The chat template's options the request sets, checked: with continue_final_message a last assistant message
    is continued rather than followed by a new turn (as in SGLang); add_generation_prompt (vLLM's) false opens no
    assistant turn; chat_template_kwargs go to the template, and reasoning_effort as its variable of that name (what
    gpt-oss-style templates read) unless chat_template_kwargs sets one. With or without tools alike."""
    kwargs = {} if body.get("chat_template_kwargs") is None else body["chat_template_kwargs"]
    effort = body.get("reasoning_effort")
    if effort is not None and not isinstance(effort, str):
        raise RadixflowError(f"reasoning_effort must be a string (low, medium, high) or null, got {effort!r}")
    cont = flag(body, "continue_final_message", False)
    turn = flag(body, "add_generation_prompt", not cont)
    if not isinstance(kwargs, dict):
        raise RadixflowError("chat_template_kwargs must be an object")
    if cont and turn:
        raise RadixflowError("continue_final_message continues the last message: it cannot also add a new "
                             "assistant turn; drop add_generation_prompt")
    clash = sorted(set(kwargs) & _TEMPLATE_ARGS)
    if clash:
        raise RadixflowError(f"chat_template_kwargs may not set {', '.join(clash)}")
    if cont and messages[-1]["role"] != "assistant":
        raise RadixflowError(f"continue_final_message continues the last message, which must be the assistant's; "
                             f"it is {messages[-1]['role']!r}: add the assistant's partial answer or drop the flag")
    effort = {} if effort is None else {"reasoning_effort": effort}
    return {"add_generation_prompt": turn, "continue_final_message": cont, **effort, **kwargs}


def _messages(messages: Any) -> list:
    if not isinstance(messages, list) or not messages:
        raise RadixflowError("messages must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise RadixflowError(f"messages[{i}] must be an object with role one of {', '.join(_ROLES)}")
        if m.get("content") is None and not (m["role"] == "assistant" and m.get("tool_calls")):
            raise RadixflowError(f"messages[{i}] ({m['role']}) needs content (only an assistant message with tool_calls "
                                 "may leave it out)")
        out.append({"role": m["role"], "content": _content(m.get("content"), i)})
    return out


_TEXT_PARTS = ("text", "input_text")  # OpenAI's chat and responses spellings; SGLang takes both


def _content(content: Any, i: int) -> str:
    """A message's text. A list of text parts is joined with spaces, as SGLang renders it for a template that takes
    text (vLLM uses newlines): "".join ran a part's last word into the next one's first."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        if any(p.get("type") not in _TEXT_PARTS or not isinstance(p.get("text"), str) for p in content):
            raise RadixflowError(f"messages[{i}].content: only text parts are supported "
                                 '({"type": "text", "text": ...}); images, audio and files are not')
        return " ".join(p["text"] for p in content)
    raise RadixflowError(f"messages[{i}].content must be a string or a list of text parts")
