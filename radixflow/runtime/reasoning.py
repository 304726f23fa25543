"""Reasoning ("thinking") text apart from the answer, for reasoning models' outputs.

A reasoning model writes its thinking between two markers (`<think>` ... `</think>` for most)
and the answer after the closing one. `--reasoning-parser NAME` (as SGLang's and vLLM's flag)
makes /v1/chat/completions return the thinking as `reasoning_content` and the rest as
`content`; `POST /separate_reasoning` and the DSL's `separate_reasoning()` split a text the
same way.

The rule, on an output's whole text so far:
- the thinking is a block at the start of the output (after leading whitespace), opened by the
  start marker; a "forced" format (the chat template already wrote the start marker, as
  DeepSeek-R1's does) is in the block from the first character, and a prompt that ends with
  the start marker forces any format;
- the block ends at the end marker, or where a tool call starts (formats with `tool_start`),
  or with the output (cut by max_tokens: all thinking, no answer);
- while streaming, a trailing piece of text that may be the start of a marker is held back
  until the next token shows whether it is one, so a delta never holds half a marker.
Splitting the text so far this way only ever extends both parts, so stream deltas are
suffixes, and the concatenated deltas equal the split of the finished text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from radixflow.errors import RadixflowError


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    start: str
    end: str
    forced: bool = False  # the chat template opens the block: the output starts inside it
    tool_start: Optional[str] = None  # a tool call starting here ends an unclosed block


_THINK = ("<think>", "</think>")
FORMATS = {
    f.name: f
    for f in (
        ReasoningFormat("deepseek-r1", *_THINK, forced=True),
        ReasoningFormat("deepseek-v3", *_THINK),
        ReasoningFormat("qwen3", *_THINK, tool_start="<tool_call>"),
        ReasoningFormat("qwen3-thinking", *_THINK, forced=True, tool_start="<tool_call>"),
        ReasoningFormat("glm45", *_THINK, tool_start="<tool_call>"),
        ReasoningFormat("nemotron_3", *_THINK, tool_start="<tool_call>"),
        ReasoningFormat("interns1", *_THINK, tool_start="<tool_call>"),
        ReasoningFormat("step3", *_THINK, forced=True),
        ReasoningFormat("minimax", *_THINK, forced=True),
        ReasoningFormat("kimi", "\u25c1think\u25b7", "\u25c1/think\u25b7"),
        ReasoningFormat("mistral", "[THINK]", "[/THINK]"),
    )
}
NAMES = tuple(FORMATS)


def get_format(name: str) -> ReasoningFormat:
    """The format for a --reasoning-parser / model_type name; a clear error for an unknown one."""
    if not isinstance(name, str) or name.lower() not in FORMATS:
        raise RadixflowError(f"unknown reasoning parser {name!r}; choose one of {', '.join(NAMES)}")
    return FORMATS[name.lower()]


@dataclass
class Split:
    reasoning: str
    content: str
    block: str  # "none" (no thinking), "open" (no end marker yet) or "closed"


def split(text: str, fmt: ReasoningFormat, forced: Optional[bool] = None, final: bool = True) -> Split:
    """The thinking and the answer in `text`. `final=False` (a stream's text so far) holds back a
    trailing piece that may still become a marker. `forced`: None = the format's own."""
    forced = fmt.forced if forced is None else forced
    body = text.lstrip()
    lead = len(text) - len(body)
    if body.startswith(fmt.start):
        begin = lead + len(fmt.start)
    elif forced:
        begin = lead if (final or not fmt.start.startswith(body)) else len(text)
    elif not final and body and fmt.start.startswith(body):
        return Split("", "", "open")  # may still be the start marker: say nothing yet
    elif not final and not body:
        return Split("", "", "none")
    else:
        return Split("", text, "none")
    rest = text[begin:]
    end = rest.find(fmt.end)
    tool = rest.find(fmt.tool_start) if fmt.tool_start else -1
    if end >= 0 and not 0 <= tool < end:
        return Split(rest[:end], rest[end + len(fmt.end) :], "closed")
    if tool >= 0:
        return Split(rest[:tool], rest[tool:], "closed")
    if final:
        return Split(rest, "", "open")
    hold = max(_partial_suffix(rest, m) for m in (fmt.end, fmt.tool_start) if m)
    return Split(rest[: len(rest) - hold], "", "open")


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def prompt_forces(fmt: ReasoningFormat, prompt: str) -> bool:
    """Whether the output starts inside the block: the format says so, or the rendered prompt
    ends with the start marker (templates that open the thinking for the model)."""
    return fmt.forced or prompt.rstrip().endswith(fmt.start)


@dataclass(frozen=True)
class ReasoningPlan:
    """How one chat request's outputs are split."""

    fmt: ReasoningFormat
    forced: bool
    stream_reasoning: bool = True

    def split(self, text: str) -> Split:
        return split(text, self.fmt, self.forced)

    def stream(self) -> "ReasoningStream":
        return ReasoningStream(self)


@dataclass
class ReasoningStream:
    """Deltas of one streamed choice: feed the output's text so far, get what is new.
    With stream_reasoning=False the thinking comes as one delta once its block closes."""

    plan: ReasoningPlan
    reasoning_sent: int = 0
    content: str = ""  # the answer so far (what tool-call parsing reads)

    def delta(self, text: str, finished: bool) -> tuple[str, str]:
        """(new reasoning text, new content text)."""
        s = split(text, self.plan.fmt, self.plan.forced, final=finished)
        reasoning = ""
        if self.plan.stream_reasoning or s.block != "open" or finished:
            reasoning = s.reasoning[self.reasoning_sent :]
            self.reasoning_sent = len(s.reasoning)
        new, self.content = s.content[len(self.content) :], s.content
        return reasoning, new


def reasoning_tokens(output_ids: list, s: Split, fmt: ReasoningFormat, tokenizer) -> int:
    """Output tokens spent thinking, markers included, for usage: all of them while the block is
    open; up to the end marker's token where it is one token; else the thinking re-encoded."""
    if s.block == "none":
        return 0
    if s.block == "open":
        return len(output_ids)
    end_ids = tokenizer.encode(fmt.end, add_special_tokens=False)
    if len(end_ids) == 1 and end_ids[0] in output_ids:
        return output_ids.index(end_ids[0]) + 1
    return min(len(output_ids), len(tokenizer.encode(s.reasoning + fmt.end, add_special_tokens=False)))
