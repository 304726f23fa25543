"""Role markers for `system/user/assistant` blocks, read off the model's own chat
template (rendered with marker contents and split), so programs format turns exactly
as the tokenizer's `apply_chat_template` would."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

ROLES = ("system", "user", "assistant")
_MARK = "\u2060RFMARK\u2060"


@dataclass
class ChatTemplate:
    prefixes: dict = field(default_factory=dict)
    suffixes: dict = field(default_factory=dict)
    default_system: Optional[str] = None  # inserted when the first role is not system

    def begin(self, role: str) -> str:
        return self.prefixes.get(role, "")

    def end(self, role: str) -> str:
        return self.suffixes.get(role, "")

    @classmethod
    def plain(cls) -> "ChatTemplate":
        """For models without a chat template."""
        return cls({r: f"{r.upper()}: " for r in ROLES}, {r: "\n" for r in ROLES})

    @classmethod
    def messages_only(cls) -> "ChatTemplate":
        """For chat APIs, which format turns themselves: roles add no text."""
        return cls()

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "ChatTemplate":
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            return cls.plain()

        def render(msgs: list) -> str:
            return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)

        sys_only = render([{"role": "system", "content": _MARK}])
        prefixes, suffixes = {}, {}
        prefixes["system"], suffixes["system"] = sys_only.split(_MARK)
        base = render([{"role": "system", "content": "x"}])
        for role in ("user", "assistant"):
            full = render([{"role": "system", "content": "x"}, {"role": role, "content": _MARK}])
            prefixes[role], suffixes[role] = full[len(base) :].split(_MARK) if full.startswith(base) else ("", "")
        return cls(prefixes, suffixes, _default_system(render, prefixes, suffixes))


def _default_system(render, prefixes: dict, suffixes: dict) -> Optional[str]:
    only_user = render([{"role": "user", "content": _MARK}])
    head = only_user.split(_MARK)[0]
    if not head.endswith(prefixes["user"]):
        return None
    head = head[: len(head) - len(prefixes["user"])]
    sys_pre, sys_suf = prefixes["system"], suffixes["system"]
    if head and head.startswith(sys_pre) and head.endswith(sys_suf):
        return head[len(sys_pre) : len(head) - len(sys_suf)]
    return None
