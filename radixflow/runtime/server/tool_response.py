"""Tool calls in chat responses: the assistant message of a finished output, and the
OpenAI streaming deltas (a call's id and name first, then its argument fragments)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Optional

from radixflow.runtime.server.tool_formats import ParsedCall, ToolFormat, parse


def new_call_id(fmt: ToolFormat) -> str:
    if fmt.name == "mistral":  # Mistral's chat template accepts only 9-character ids
        return uuid.uuid4().hex[:9]
    return "call_" + uuid.uuid4().hex[:24]


def _call(call_id: str, c: ParsedCall) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}


def tool_message(fmt: ToolFormat, text: str, finish: Optional[str]) -> tuple:
    """(message, finish_reason) for a finished output. Only complete calls are returned; an
    output without any (free text, or a call cut off by max_tokens) stays content."""
    p = parse(text, fmt, final=True)
    calls = [c for c in p.calls if c.complete]
    if not calls:
        return {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}, finish
    msg = {"role": "assistant", "content": p.content.rstrip() or None, "reasoning_content": None,
           "tool_calls": [_call(new_call_id(fmt), c) for c in calls]}  # fmt: skip
    return msg, ("tool_calls" if finish == "stop" else finish)


@dataclass
class ToolStream:
    """What one streamed choice has sent so far."""

    fmt: ToolFormat
    content: int = 0  # characters of free text sent
    ids: list = field(default_factory=list)  # one per call announced
    args: list = field(default_factory=list)  # characters of each call's arguments sent

    def delta(self, text: str, first: bool, finished: bool, finish: Optional[str]) -> tuple:
        """(delta, finish_reason) for the output so far."""
        p = parse(text, self.fmt, final=finished)
        delta: dict = {"role": "assistant"} if first else {}
        no_calls = finished and not self.ids and not any(c.complete for c in p.calls)
        # as tool_message: an output without calls is all content; whitespace before a call is not (held back while
        # a call may follow: the stream sent the "\n" before `<tool_call>` that the whole message dropped)
        content = text if no_calls else p.content.rstrip()
        if len(content) > self.content:
            delta["content"] = content[self.content :]
            self.content = len(content)
        elif no_calls and self.content == 0:  # an empty answer: "" as the non-streamed message has, not null
            delta["content"] = ""
        calls = [self._call_delta(k, c) for k, c in enumerate(p.calls) if c.name is not None]
        calls = [c for c in calls if c is not None]
        if calls:
            delta["tool_calls"] = calls
        if finished and finish == "stop" and any(c.complete for c in p.calls):  # as tool_message: a call a stop
            finish = "tool_calls"  # string cut off was streamed (sent deltas stay sent) but is not a finished call
        return delta, finish

    def _call_delta(self, k: int, c: ParsedCall) -> Optional[dict]:
        if k == len(self.ids):
            self.ids.append(new_call_id(self.fmt))
            self.args.append(len(c.arguments))
            return {"index": k, **_call(self.ids[k], c)}
        fragment = c.arguments[self.args[k] :]
        if not fragment:
            return None
        self.args[k] = len(c.arguments)
        return {"index": k, "function": {"arguments": fragment}}
