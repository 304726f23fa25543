"""The tool side of a chat request: validate `tools`, `tool_choice`, `parallel_tool_calls`
and tool histories; render the prompt with the tools; build the grammar of the calls.

    plan = plan_tools(body, messages, tokenizer, parser)   # None: the request uses no tools
    plan.prompt, plan.regex, plan.choice

With tool_choice `required` or a named function the whole output is the calls section; with
`auto` it is free text optionally followed by the calls section; with `none` nothing is
constrained (and nothing is parsed). Either way the calls are decoded under a regex built
from the functions' own parameter schemas, so every call parses and validates.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional

from radixflow.constrained import regex_for_schema
from radixflow.errors import RadixflowError
from radixflow.runtime.tokenizer import apply_chat_template
from radixflow.runtime.server.tool_formats import (
    ARGS_WHITESPACE,
    FORMATS,
    ToolFormat,
    auto_regex,
    call_regex,
    calls_regex,
    detect_format,
    template_has_tools,
)

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_NO_ARGS = r"\{\}"
_CHOICES = ("none", "auto", "required")
_GRAMMAR_FIELDS = ("response_format", "regex", "json_schema", "ebnf")


@dataclass
class Tool:
    name: str
    description: Optional[str]
    parameters: Optional[dict]
    args_regex: str

    def spec(self) -> dict:
        fn: dict = {"name": self.name}
        if self.description is not None:
            fn["description"] = self.description
        fn["parameters"] = self.parameters if self.parameters is not None else {"type": "object", "properties": {}}
        return {"type": "function", "function": fn}


@dataclass
class ToolPlan:
    tools: list
    fmt: ToolFormat
    choice: str  # none | auto | required | named
    prompt: str
    regex: Optional[str]  # the grammar of the output; None when nothing is constrained


def plan_tools(body: dict, messages: list, tokenizer, parser: str = "auto",
               template_options: Optional[dict] = None) -> Optional[ToolPlan]:
    """`messages`: the request's messages with their content already normalized (role, content);
    `template_options`: the chat template's other arguments (continue_final_message, ...).
    None when the request has neither tools nor tool messages."""
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):  # checked with or without tools, as OpenAI does
        raise RadixflowError(f"parallel_tool_calls must be true or false, got {parallel!r}")
    raw = body.get("messages") or []
    has_history = any(isinstance(m, dict) and (m.get("tool_calls") or m.get("role") == "tool") for m in raw)
    if body.get("tools") is None and body.get("tool_choice") in (None, "none") and not has_history:
        return None
    tools = parse_tools(body.get("tools"))
    choice, named = parse_tool_choice(body.get("tool_choice"), tools)
    constrained = [f for f in _GRAMMAR_FIELDS if body.get(f) is not None and not _plain_text(body, f)]
    if choice != "none" and constrained:
        given = ", ".join(constrained)
        raise RadixflowError(f"{given} cannot be combined with tool calls; drop it or set tool_choice to 'none'")
    template = tokenizer.chat_template
    fmt = detect_format(template) if parser == "auto" else FORMATS[parser]
    history = with_tool_fields(raw, messages)
    options = template_options or {}
    if template_has_tools(template):
        prompt = _render(tokenizer, history, [t.spec() for t in tools] or None, options)
    else:
        prompt = _render(tokenizer, generic_history(history, tools, fmt), None, options)
    return ToolPlan(tools, fmt, choice, prompt, grammar(tools, fmt, choice, named, parallel is not False))


def _plain_text(body: dict, field: str) -> bool:
    """response_format {"type": "text"}: OpenAI's default, which constrains nothing (so goes with tools)."""
    return field == "response_format" and body[field] == {"type": "text"}


def grammar(tools: list, fmt: ToolFormat, choice: str, named: Optional[str], parallel: bool) -> Optional[str]:
    if choice == "none":
        return None
    chosen = [t for t in tools if named is None or t.name == named]
    calls = calls_regex(fmt, [call_regex(fmt, t.name, t.args_regex) for t in chosen], parallel and named is None)
    return auto_regex(fmt, calls) if choice == "auto" else calls


def check_legacy_functions(body: dict) -> None:
    """OpenAI's deprecated `functions` / `function_call` get a 400 that names their replacements."""
    if isinstance(body, dict) and ("functions" in body or "function_call" in body):
        raise RadixflowError(
            "functions and function_call are OpenAI's deprecated names; send each function as "
            'tools=[{"type": "function", "function": {...}}] and function_call as tool_choice'
        )


# -- validation --------------------------------------------------------------------------------------------------
def parse_tools(tools: Any) -> list:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise RadixflowError('tools must be a list of {"type": "function", "function": {"name", "parameters"}}')
    out, seen = [], set()
    for i, t in enumerate(tools):
        tool = _tool(t, f"tools[{i}]")
        if tool.name in seen:
            raise RadixflowError(f"tools[{i}]: the function name {tool.name!r} is used twice; give each tool its own name")
        seen.add(tool.name)
        out.append(tool)
    return out


def _tool(t: Any, where: str) -> Tool:
    if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(t.get("function"), dict):
        raise RadixflowError(f'{where} must be {{"type": "function", "function": {{"name": ..., "parameters": ...}}}}')
    fn = t["function"]
    name, desc, params = fn.get("name"), fn.get("description"), fn.get("parameters")
    if not isinstance(fn.get("strict", False), (bool, type(None))):
        raise RadixflowError(f"{where}.function.strict must be true or false")  # either way the schema is enforced
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise RadixflowError(f"{where}.function.name must be 1-64 letters, digits, '_', '.' or '-', got {name!r}")
    if desc is not None and not isinstance(desc, str):
        raise RadixflowError(f"{where}.function.description must be a string")
    if params is None:
        return Tool(name, desc, None, _NO_ARGS)
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        raise RadixflowError(f'{where}.function.parameters must be a JSON schema with "type": "object"')
    try:
        args = regex_for_schema(json.dumps(params), ARGS_WHITESPACE, loose=True)
    except RadixflowError as e:
        raise RadixflowError(f"{where} ({name}) parameters: {e}") from None
    return Tool(name, desc, params, args)


def parse_tool_choice(choice: Any, tools: list) -> tuple:
    """(mode, the named function or None)."""
    if choice is None:
        return ("auto" if tools else "none"), None
    if choice in _CHOICES:
        if choice != "none" and not tools:
            raise RadixflowError(f"tool_choice {choice!r} needs tools; add 'tools' or drop tool_choice")
        return choice, None
    fn = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(fn, dict) or choice.get("type") != "function" or not isinstance(fn.get("name"), str):
        raise RadixflowError('tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}')
    names = [t.name for t in tools]
    if fn["name"] not in names:
        known = ", ".join(names) or "none given"
        raise RadixflowError(f"tool_choice names the function {fn['name']!r}, which is not in tools ({known})")
    return "named", fn["name"]


def with_tool_fields(raw: list, messages: list) -> list:
    """`messages` plus the assistant's tool_calls (arguments parsed) and the tool messages'
    tool_call_id and name, checked against each other."""
    out, calls = [], {}
    for i, (m, norm) in enumerate(zip(raw, messages)):
        msg = dict(norm)
        if m.get("tool_calls"):
            if m["role"] != "assistant" or not isinstance(m["tool_calls"], list):
                raise RadixflowError(f"messages[{i}]: only assistant messages carry tool_calls, as a list")
            msg["tool_calls"] = [_history_call(c, f"messages[{i}].tool_calls[{k}]") for k, c in enumerate(m["tool_calls"])]
            calls.update((c["id"], c["function"]["name"]) for c in msg["tool_calls"])
        if m["role"] == "tool":
            cid = m.get("tool_call_id")
            if not isinstance(cid, str):
                raise RadixflowError(f"messages[{i}]: a tool message needs tool_call_id, the id of the call it answers")
            if cid not in calls:
                known = ", ".join(map(repr, calls)) or "none yet"
                raise RadixflowError(
                    f"messages[{i}]: tool_call_id {cid!r} matches no tool call of an earlier assistant message "
                    f"(ids: {known}); give the id of the call this result answers"
                )
            msg.update(tool_call_id=cid, name=calls[cid])
        out.append(msg)
    return out


def _history_call(c: Any, where: str) -> dict:
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(c.get("id"), str) or not isinstance(fn.get("name"), str):
        raise RadixflowError(f'{where} must be {{"id": ..., "type": "function", "function": {{"name", "arguments"}}}}')
    args = fn.get("arguments", "{}")
    try:
        parsed = json.loads(args) if isinstance(args, str) else args
    except json.JSONDecodeError as e:
        raise RadixflowError(f"{where}.function.arguments must be a JSON object's text: {e}") from None
    if not isinstance(parsed, dict):
        raise RadixflowError(f"{where}.function.arguments must be a JSON object")
    return {"id": c["id"], "type": "function", "function": {"name": fn["name"], "arguments": parsed}}


# -- prompting -----------------------------------------------------------------------------------------------------
def _render(tokenizer, messages: list, tools: Optional[list], options: dict) -> str:
    from jinja2 import TemplateError

    try:
        return apply_chat_template(tokenizer, messages, tools=tools, **options)
    except TemplateError as e:
        raise RadixflowError(f"the model's chat template refused these messages: {e}") from None


def generic_history(messages: list, tools: list, fmt: ToolFormat) -> list:
    """For templates without tool support: the tools and the call syntax in the system
    message, earlier calls written out in the assistant's text, results as user messages."""
    out = [_generic_message(m, fmt) for m in messages]
    if tools:
        if out and out[0]["role"] in ("system", "developer"):
            out[0]["content"] = out[0]["content"] + "\n\n" + tools_instructions(tools, fmt)
        else:
            out.insert(0, {"role": "system", "content": tools_instructions(tools, fmt)})
    return out


def _generic_message(m: dict, fmt: ToolFormat) -> dict:
    if m.get("tool_calls"):
        calls = [{"name": c["function"]["name"], fmt.args_key: c["function"]["arguments"]} for c in m["tool_calls"]]
        return {"role": m["role"], "content": (m["content"] + "\n" if m["content"] else "") + format_calls(fmt, calls)}
    if m["role"] == "tool":
        return {"role": "user", "content": tool_response(m["content"])}
    return {"role": m["role"], "content": m["content"]}


def tool_response(content: str) -> str:
    """A tool's result as the generic format hands it back (in a user message)."""
    return f"<tool_response>\n{content}\n</tool_response>"


def format_calls(fmt: ToolFormat, calls: list) -> str:
    """Calls written in `fmt` (each a {"name", args_key} dict), as the grammar would emit them."""
    parts = [fmt.call_open + json.dumps(c) + fmt.call_close for c in calls]
    return fmt.section_open + fmt.separator.join(parts) + fmt.section_close


def tools_instructions(tools: list, fmt: ToolFormat) -> str:
    listing = "\n".join(json.dumps(t.spec()) for t in tools)
    example = format_calls(fmt, [{"name": "FUNCTION_NAME", fmt.args_key: {"ARGUMENT": "VALUE"}}])
    return (
        "You may call the functions described below; their parameters are JSON schemas.\n"
        f"<tools>\n{listing}\n</tools>\n"
        "To call a function, write exactly this, with the arguments as a JSON object:\n"
        f"{example}\n"
        "After calling, wait for the results; they come back inside <tool_response></tool_response>."
    )
