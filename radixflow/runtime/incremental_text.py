"""Text of a growing list of output token ids, decoded a window at a time: only the ids
since the last confirmed boundary are decoded again, and an incomplete UTF-8 character
at the end waits for the next token. Used by the detokenizer's streams and by streamed
request graphs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class IncrementalText:
    text: str = ""  # confirmed text of ids[:read]
    surr: int = 0  # decode window start (context so spaces/merges come out right)
    read: int = 0  # ids up to here are in `text`

    def update(self, tokenizer, ids: list, skip_special_tokens: bool = True) -> str:
        """The text of `ids` (which only grow between calls), as far as it is settled."""
        if len(ids) > self.read:
            kw = {"skip_special_tokens": skip_special_tokens}
            prefix = tokenizer.decode(ids[self.surr : self.read], **kw)
            full = tokenizer.decode(ids[self.surr :], **kw)
            if not full.endswith("\ufffd"):
                self.text += full[len(prefix) :]
                self.surr, self.read = self.read, len(ids)
        return self.text


def partial_stop_len(text: str, stops: list) -> int:
    """Length of the longest tail of `text` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best
