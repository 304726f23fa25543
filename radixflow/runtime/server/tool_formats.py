"""Tool-call text formats per model family: the grammar a call is decoded under, and the
parser that reads calls back out of the output (whole or while it streams).

Every format writes a call as one JSON object `{"name": "NAME", "arguments": ARGS}` (Llama 3
says "parameters"), wrapped and separated as the family's chat template expects:

    hermes / qwen / qwen25 / generic   <tool_call>\\n{"name": ...}\\n</tool_call>   (one block per call, "\\n" between)
    mistral                            [TOOL_CALLS] [{"name": ...}, {"name": ...}]
    llama3                             {"name": ..., "parameters": ...}; {"name": ...}   (only at the start)

The grammar is one regex: the calls section, optionally after free text that never contains
the section's opening (`auto`), so once the model opens a call it can only finish a valid one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Optional

from radixflow.constrained import escape


@dataclass(frozen=True)
class ToolFormat:
    name: str
    call_open: str = ""  # before each call's JSON object
    call_close: str = ""  # after it
    separator: str = ""  # between parallel calls
    section_open: str = ""  # before the first call
    section_close: str = ""  # after the last
    args_key: str = "arguments"
    after_text: bool = True  # auto: a call may follow free text (False: calls only at the very start)

    @property
    def opener(self) -> str:
        """The text that starts the calls section."""
        return self.section_open + self.call_open + '{"name": "'


_HERMES = dict(call_open="<tool_call>\n", call_close="\n</tool_call>", separator="\n")
FORMATS = {
    "hermes": ToolFormat("hermes", **_HERMES),
    "qwen": ToolFormat("qwen", **_HERMES),
    "qwen25": ToolFormat("qwen25", **_HERMES),  # SGLang's name for Qwen2.5's parser
    "generic": ToolFormat("generic", **_HERMES),
    "mistral": ToolFormat("mistral", separator=", ", section_open="[TOOL_CALLS] [", section_close="]"),
    "llama3": ToolFormat("llama3", separator="; ", args_key="parameters", after_text=False),
}
PARSER_CHOICES = ("auto",) + tuple(FORMATS)
ARGS_WHITESPACE = "[ ]?"  # JSON inside arguments: a single optional space between tokens, as models write it


def detect_format(chat_template: Optional[str]) -> ToolFormat:
    """The format a chat template's tool support implies; `generic` for templates without any."""
    t = chat_template or ""
    if not template_has_tools(t):
        return FORMATS["generic"]
    if "[TOOL_CALLS]" in t:
        return FORMATS["mistral"]
    if "<tool_call>" in t:
        return FORMATS["hermes"]
    if "<|python_tag|>" in t or "ipython" in t:
        return FORMATS["llama3"]
    return FORMATS["generic"]


def template_has_tools(chat_template: Optional[str]) -> bool:
    return isinstance(chat_template, str) and "tools" in chat_template


# -- grammar ---------------------------------------------------------------------------------------------------
def call_regex(fmt: ToolFormat, name: str, args_regex: str) -> str:
    head = escape('{"name": ' + json.dumps(name) + ', "' + fmt.args_key + '": ')
    return escape(fmt.call_open) + head + args_regex + r"\}" + escape(fmt.call_close)


def calls_regex(fmt: ToolFormat, alternatives: list, parallel: bool) -> str:
    """The calls section: one call (or, when `parallel`, one or more) among `alternatives`
    (each a call_regex)."""
    one = "(?:" + "|".join(alternatives) + ")"
    body = one + ("(?:" + escape(fmt.separator) + one + ")*" if parallel else "")
    return escape(fmt.section_open) + body + escape(fmt.section_close)


def auto_regex(fmt: ToolFormat, calls: str) -> str:
    """Free text, or free text then the calls section (or, for start-only formats, either)."""
    if not fmt.after_text:
        first = escape(fmt.opener[0])
        return f"(?:{calls}|(?:[^{first}](?:.|\\n)*)?)"
    return avoiding(_trigger(fmt.opener)) + f"(?:{calls})?"


def _trigger(opener: str) -> str:
    """The longest prefix of the opener whose first character does not recur in it (what
    `avoiding` needs); free text may not contain it, so it can only begin the calls."""
    end = opener.find(opener[0], 1)
    return opener if end < 0 else opener[:end]


def avoiding(word: str) -> str:
    """A regex for the texts that do not contain `word` (whose first character must not recur
    in it). After the first character c, a proper prefix of the rest may follow, then either a
    character that breaks the match or another c (the loop), or the end of the text."""
    c, rest = word[0], word[1:]
    assert c not in rest and rest, f"avoiding() needs a word whose first character does not recur: {word!r}"
    prefix = _nested_optional(rest[:-1])  # a proper prefix of rest, possibly empty
    breaks = []
    for k, ch in enumerate(rest):
        breaks.append(escape(rest[:k]) + f"[^{_class_escape(c)}{_class_escape(ch)}]")
    breaker = "(?:" + "|".join(breaks) + ")"
    loop = f"(?:{prefix}{escape(c)})*"
    return f"(?:[^{_class_escape(c)}]|{escape(c)}{loop}{breaker})*(?:{escape(c)}{loop}{prefix})?"


def _nested_optional(text: str) -> str:
    """Any prefix of `text` (including the empty one)."""
    out = ""
    for ch in reversed(text):
        out = f"(?:{escape(ch)}{out})?"
    return out


def _class_escape(ch: str) -> str:
    return "\\" + ch if ch in "\\]^-[" else ("\\n" if ch == "\n" else ch)


# -- parsing -----------------------------------------------------------------------------------------------------
@dataclass
class ParsedCall:
    name: Optional[str]  # None until the name is complete
    arguments: str  # the arguments' JSON text so far
    complete: bool


@dataclass
class Parsed:
    content: str  # free text before the calls (held back where it may be the opener's start)
    calls: list  # ParsedCall, the last possibly incomplete
    started: bool  # whether the calls section began


_NAME = re.compile(r'\{"name": "((?:[^"\\]|\\.)*)", "(?:arguments|parameters)": ')
_DECODER = json.JSONDecoder()


def parse(text: str, fmt: ToolFormat, final: bool) -> Parsed:
    """Reads `text` (a whole output when `final`, else the output so far)."""
    start = _section_start(text, fmt)
    if start is None:
        return Parsed(text if final else _hold_back(text, fmt.opener), [], False)
    calls, pos = [], start + len(fmt.section_open)
    while True:
        call, pos = _parse_call(text, pos, fmt)
        if call is None:
            break
        calls.append(call)
        if not call.complete or not text.startswith(fmt.separator, pos):
            break
        pos += len(fmt.separator)
    return Parsed(text[:start], calls, True)


def _section_start(text: str, fmt: ToolFormat) -> Optional[int]:
    if not fmt.after_text:
        return 0 if text.startswith(fmt.opener) else None
    at = text.find(fmt.opener)
    return None if at < 0 else at


def _parse_call(text: str, pos: int, fmt: ToolFormat) -> tuple:
    if not text.startswith(fmt.call_open, pos):
        return None, pos
    m = _NAME.match(text, pos + len(fmt.call_open))
    if m is None:
        return None, pos
    name = json.loads('"' + m.group(1) + '"')
    try:
        _, end = _DECODER.raw_decode(text, m.end())
    except ValueError:
        return ParsedCall(name, text[m.end() :], False), len(text)
    close = "}" + fmt.call_close
    complete = text.startswith(close, end)
    return ParsedCall(name, text[m.end() : end], complete), end + (len(close) if complete else 0)


def _hold_back(text: str, opener: str) -> str:
    """`text` less a tail that may be the start of the opener (not known yet)."""
    for k in range(min(len(opener), len(text)), 0, -1):
        if opener.startswith(text[-k:]):
            return text[:-k]
    return text
