"""Jump-forward: where the grammar allows exactly one continuation string, append its
tokens without sampling them.

The forced bytes come from the FSM (`CompiledGrammar.forced_bytes`). They are
re-tokenized together with the last output token, so the sequence is what the tokenizer
would have produced for that text (e.g. `"` + `,"age":` becomes `",` `"age` `":`); when
the last token changes, the scheduler cuts it (the `(keep, tokens)` answer). A jump is
only taken when it leaves the request able to finish within its token budget.

A jump does not end on a token that the grammar would also let the model extend (`[`
where `["` is allowed, `{` where `{"` is): that token is left to the sampler, or the
model would continue from a token split it never saw in training (greedy then closes
arrays empty, `[` + `]`, instead of `["` + an item).

Nothing here loops over the vocabulary: the forced bytes and the extendable check are
cached per FSM state, re-tokenization is one tokenizer call per jump (cached per text).
"""

from __future__ import annotations

from typing import Callable, Optional, Union

from radixflow.constrained.matcher import GrammarMatcher

Encode = Callable[[str], list]


def utf8_prefix(data: bytes) -> bytes:
    """The longest prefix of `data` that is whole UTF-8 (a trailing partial character dropped)."""
    for cut in range(min(4, len(data)) + 1):
        try:
            (data[: len(data) - cut]).decode("utf-8")
            return data[: len(data) - cut]
        except UnicodeDecodeError:
            continue
    return b""


def plan_jump(matcher: GrammarMatcher, req, encode: Encode, first: bool = False, limit: Optional[int] = None,
              cut: bool = True) -> Union[list, tuple]:
    """Advance `matcher` over the forced continuation and return what the scheduler
    appends: [] (nothing), [tokens] or (keep, [tokens]). `first`: before the segment's
    first sample (nothing to re-tokenize; one sampled token must still fit the budget).
    `limit`: at most this many tokens (the rest of the forced text is jumped over later).
    `cut` False: never re-spell the sampled token; the forced text is tokenized on its own and
    appended (under overlap a cut drops the pass already launched on that token). Precondition:
    the limit keeps at least the tokens that re-spell a re-tokenized sampled token (the caller's
    limits are >= 14 at a sample), so that a cut never drops text the model sampled."""
    forced = utf8_prefix(matcher.grammar.forced_bytes(matcher.state))
    if not forced:
        return []
    out = req.output_ids
    prev = [out[-1]] if len(out) > req.segment_start and not first else []
    reserve = 1 if first else 0
    for boundary in ([prev, []] if prev else [[]]):
        planned = _retokenize(matcher, boundary, forced, encode)
        if planned is None:
            continue
        common, tokens = planned
        if common < len(boundary) and not cut:
            continue
        keep = len(out) - len(boundary) + common
        undo, taken = len(boundary) - common, tokens if limit is None else tokens[: max(limit, 0)]
        tokens = _apply(matcher, req, undo, taken, keep, reserve)
        if tokens:
            return tokens if keep == len(out) else (keep, tokens)
    return []


def _retokenize(matcher: GrammarMatcher, boundary: list, forced: bytes, encode: Encode):
    """(tokens of `boundary` kept, new tokens), or None when the text does not round-trip."""
    vocab = matcher.grammar.vocab
    prefix = vocab.decode_bytes(boundary)
    if prefix is None:
        return None
    try:
        text = (prefix + forced).decode("utf-8")
    except UnicodeDecodeError:
        return None
    ids = list(encode(text))
    if vocab.decode_bytes(ids) != prefix + forced:
        return None
    common = 1 if boundary and ids[:1] == boundary else 0
    tokens = ids[common:]
    return (common, tokens) if tokens else None


def _apply(matcher: GrammarMatcher, req, undo: int, tokens: list, keep: int, reserve: int) -> list:
    """Roll back `undo` accepted tokens and accept `tokens` (less an extendable last
    token), if that fits the budget. Returns the tokens accepted ([]: nothing changed)."""
    if not tokens:
        return []
    g = matcher.grammar
    undone = req.output_ids[len(req.output_ids) - undo :] if undo else []
    matcher.rollback(undo)
    before_last = g.walk(matcher.state, tokens[:-1])
    if before_last is not None and g.extendable(before_last, tokens[-1]):
        tokens, after = tokens[:-1], before_last
    else:
        after = g.walk(before_last, tokens[-1:]) if before_last is not None else None
    used = keep - req.segment_start + len(tokens)
    fits = bool(tokens) and after is not None and used + max(int(g.dist[g.dense(after)]), reserve) <= req.sampling.max_new_tokens
    if fits and reserve and g.terminal[g.dense(after)]:
        fits = False  # before the first sample: leave the last token to sampling
    if not fits:
        matcher.advance_all(undone)
        return []
    return tokens if matcher.advance_all(tokens) else []
