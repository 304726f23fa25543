"""A short completion to an accepting state, found by search over llguidance matcher states.

llguidance keeps no distance to an accepting state (outlines' per-state `dist`), so
budget-aware completion on it needs a completion found by search:

    search = ClosingSearch(tokenizer_info)
    path = search.find(matcher, limit)   # token ids that take `matcher` to an accepting state, or None

The search is a greedy walk; nothing in it loops over the vocabulary in Python. Each step
takes the grammar's forced tokens if there are any; otherwise it computes the mask and
takes the first allowed token of a short preference list, else of the few lowest-id
allowed tokens (single characters, in byte-level vocabularies) one that completes the
output at once, or the lowest. Two lists: inside free string
content (a probe word is allowed) closing quotes come first (`"}`, `",`, `":`, `"`);
elsewhere closing brackets, then separators, then the shortest JSON values (`0`, `""`,
`[]`, `null`, ...), then openers. Inside a string or number, a token after which the mask is
one already seen in that lexeme made no progress: it is undone and passed over while
another token is allowed (an email's local part takes one character, then the others are
tried until `@` opens the domain). Once a few tokens were passed over, such a token is first
taken again a few times: in a counted repetition (`[0-9]{5}`) the mask changes only at the count.
Where masks show no progress (an unanchored `pattern`, a long `minLength`), sample strings
from the grammar's spec (closing_hints.py, as `hints`: token lists) are tried wherever a
string opens (after a token that ends with `"`, and at the start): one the matcher accepts, after which the string may close, is
taken whole.
The walk consumes on the matcher itself and rolls back before returning. Its length
bounds the distance to acceptance from above; it is not always the shortest completion.
"""

from __future__ import annotations

import itertools
from typing import Optional

import numpy as np
from llguidance import LLMatcher

from radixflow.constrained.options import TokenizerInfo

PROBE_WORD = "the"  # allowed inside free string content, nowhere else in JSON
STRUCTURE = "{}[],:"  # one of these allowed: between JSON values, not inside a string or number
FALLBACK_TRIES = 8  # lowest-id allowed tokens tried for one that completes the output at once
MAX_PICKS = 512  # mask computations per search: a walk that needs more gives up
REPEATS = 8  # a token that made no visible progress is taken again up to this often,
REPEAT_AFTER = 24  # once this many others were passed over (a shorter way, `ed` for 2 hex digits, first)


def _closers(alphabet: str, first: str = "") -> list:
    """Strings over `alphabet` (prefixed with `first`), longest first."""
    return [first + "".join(p) for n in (3, 2, 1, 0) for p in itertools.product(alphabet, repeat=n) if first or n]


def string_preferences() -> list:
    return _closers("}]", '"') + ['":', '",'] + structural_preferences()


def structural_preferences() -> list:
    values = ["0", '""', "[]", "{}", "null", "true", "false"]
    # separators before values: after a number, `,` ends it where `0` would extend it
    return _closers("}]") + [",", ":"] + values + ['"', ',"', ':"', '{"', '["', "{", "["]


class ClosingSearch:
    def __init__(self, info: TokenizerInfo):
        self.eos_ids = list(info.eos_ids)
        self.words = (info.vocab_size + 31) // 32
        self.in_string = _single_tokens(info.tokenizer, string_preferences(), info.vocab_size)
        self.structural = _single_tokens(info.tokenizer, structural_preferences(), info.vocab_size)
        probe = info.tokenizer.encode(PROBE_WORD, add_special_tokens=False)
        self.probe = probe[0] if len(probe) == 1 else None
        self.structure = _single_tokens(info.tokenizer, list(STRUCTURE), info.vocab_size)
        pieces = info.tokenizer.convert_ids_to_tokens(list(range(info.vocab_size)))
        self.opens_string = np.array([bool(p) and p.endswith('"') for p in pieces], dtype=bool)
        self.quote_closers = [t for t in self.in_string.tolist() if info.tokenizer.decode([t]).startswith('"')]

    def find(self, m: LLMatcher, limit: int, hints: tuple = ()) -> Optional[list]:
        r"""Tokens from `m`'s state to an accepting one, at most `limit` of them; None if
        the walk finds none. `m` is left in the state it was in. Where the walk finds none, a second one first
        takes any of the lowest-id allowed tokens after which the output is complete: the preferences lead a regex
        such as `( [a-z]+,)+ [a-z]+\.` round its loop (`a`, `,`, ` `, ...) and never to its `.` (fuzzing, session
        30: a streamed request, checked at every token, lost the model's tokens to the old path far from its
        budget)."""
        path = self._walk(m, limit, hints, False)
        return path if path is not None else self._walk(m, limit, hints, True)

    def _walk(self, m: LLMatcher, limit: int, hints: tuple, close_first: bool) -> Optional[list]:
        path: list = []
        walk = _Walk()
        hinted = -1  # the path length at which hints were last tried (once per string opening)
        for _ in range(min(2 * limit + 16, MAX_PICKS)):
            if m.is_accepting() or len(path) >= limit:
                break
            if hints and hinted != len(path) and (not path or self.opens_string[path[-1]]):
                hinted = len(path)
                sample = self._try_hints(m, hints, limit - len(path))
                if sample is not None:
                    path.extend(sample)
                    walk = _Walk()
                    continue
            forced = m.compute_ff_tokens()[: limit - len(path)]
            if forced:
                if hints:  # stop after a string's opening quote, where hints are tried
                    opens = np.flatnonzero(self.opens_string[forced])
                    forced = forced[: opens[0] + 1] if opens.size else forced
                if not m.consume_tokens(forced):
                    break
                path.extend(forced)
                walk = _Walk()
                continue
            if walk.mask is None:
                walk.arrive(self._mask(m), self._in_lexeme)
            token, anyway = self._pick(m, walk.mask, walk.skip, close_first)
            if token is None or not m.consume_token(token):
                break
            path.append(token)
            if m.is_accepting() or anyway:
                walk.mask = None
                continue
            after = self._mask(m)
            if walk.seen_before(after, self._in_lexeme):  # repeats only once a few tokens were passed over
                after = self._repeat(m, token, walk, path, limit) if len(walk.skip) >= REPEAT_AFTER else None
            if after is None:  # no progress: undo it, try another token
                m.rollback(1)
                path.pop()
                walk.skip.add(token)
            else:
                walk.arrive(after, self._in_lexeme)
        found = m.is_accepting() and not m.is_error()
        m.rollback(len(path))
        return path if found else None

    def _repeat(self, m: LLMatcher, token: int, walk: "_Walk", path: list, limit: int) -> Optional[np.ndarray]:
        """`token` left the mask as it was: take it again, up to REPEATS times, in case it
        counts (`[0-9]{5}`, or 5 digits anywhere in an unanchored pattern): progress is a
        token allowed that was not before (`-` after `[0-9]{3}`; reaching the bound of
        `[a-z]{1,20}` only takes tokens away). One mask decides; then the fewest copies that
        make the progress join `path`, and the mask there is returned. None: no progress."""
        before = walk.mask
        n = m.try_consume_tokens([token] * min(REPEATS, limit - len(path)))
        progress = n and self._opens(m, before)
        m.rollback(n)
        if not progress:
            return None
        for k in range(1, n + 1):
            m.consume_token(token)
            mask = self._mask(m)
            if m.is_accepting() or bool(np.any(mask & ~before)):
                path.extend([token] * k)
                return mask
        raise AssertionError("the same copies opened a token before")

    def _opens(self, m: LLMatcher, before: np.ndarray) -> bool:
        return m.is_accepting() or bool(np.any(self._mask(m) & ~before))

    def _try_hints(self, m: LLMatcher, hints: tuple, room: int) -> Optional[list]:
        """The first hint `m` accepts whole and after which it may end or close a string
        (consumed on `m`), else None (`m` unchanged); None too where the string may close
        (or the output end) at once, as the walk would do."""
        if m.is_accepting() or self._closes(self._mask(m)):
            return None
        for tokens in hints:
            if len(tokens) > room:
                continue
            done = m.try_consume_tokens(tokens)
            if done == len(tokens) and (m.is_accepting() or self._closes(self._mask(m))):
                return list(tokens)
            m.rollback(done)
        return None

    def _closes(self, mask: np.ndarray) -> bool:
        bits = mask.view(np.uint32)
        return any(_has(bits, int(t)) for t in self.quote_closers)

    def _mask(self, m: LLMatcher) -> np.ndarray:
        mask = np.zeros(self.words, dtype=np.int32)
        m.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        return mask

    def _in_string(self, mask: np.ndarray) -> bool:
        return self.probe is not None and _has(mask.view(np.uint32), self.probe)

    def _in_lexeme(self, mask: np.ndarray) -> bool:
        """Inside a string or number (free content, or one with a pattern): where a token can
        make no progress. Between values the closers always do (and a mask may recur at
        another depth), so progress is not checked there."""
        bits = mask.view(np.uint32)
        return self._in_string(mask) or not any(_has(bits, int(t)) for t in self.structure)

    def _pick(self, m: LLMatcher, mask: np.ndarray, skip: set, close_first: bool = False) -> tuple:
        """(token, anyway): anyway = every allowed token was passed over, so this one is
        taken even though it makes no visible progress (e.g. digits of `[0-9]{30}`). close_first: a token of the
        lowest-id allowed ones that completes the output comes before the preferences."""
        if close_first:
            ids = _first_allowed(mask, FALLBACK_TRIES)  # up to 32 a word: the first FALLBACK_TRIES are tried
            done = next((t for t in ids[~np.isin(ids, self.eos_ids)][:FALLBACK_TRIES].tolist() if _accepts_after(m, t)), None)
            if done is not None:
                return done, False
        bits = mask.view(np.uint32)
        prefs = self.in_string if self._in_string(mask) else self.structural
        allowed = (bits[prefs >> 5] >> (prefs & 31).astype(np.uint32)) & 1
        for i in np.flatnonzero(allowed)[: len(skip) + 1].tolist():
            if int(prefs[i]) not in skip:
                return int(prefs[i]), False
        ids = _first_allowed(mask, FALLBACK_TRIES + len(skip) + len(self.eos_ids) + 1)
        ids = ids[~np.isin(ids, self.eos_ids)]
        fresh = ids[~np.isin(ids, list(skip))] if skip else ids
        anyway = not fresh.size
        # repeating anyway: not the lowest (`0`), so digit runs are not all zeros (year 0000 is no date)
        first = (ids[1:] if anyway and ids.size > 1 else ids if anyway else fresh)[:FALLBACK_TRIES].tolist()
        return next((t for t in first if _accepts_after(m, t)), first[0] if first else None), anyway


class _Walk:
    """Where the walk is within one stretch of a lexeme (string or number) or of structure:
    the current state's mask, the masks seen so far in a lexeme, the tokens passed over."""

    def __init__(self):
        self.mask, self.inside = None, None
        self.seen: set = set()
        self.skip: set = set()

    def arrive(self, mask: np.ndarray, in_lexeme) -> None:
        inside = in_lexeme(mask)
        if inside != self.inside:  # into or out of a lexeme: nothing seen here yet
            self.inside, self.seen, self.skip = inside, set(), set()
        self.mask = mask
        self.seen.add(hash(mask.tobytes()))

    def seen_before(self, mask: np.ndarray, in_lexeme) -> bool:
        return bool(self.inside) and in_lexeme(mask) and hash(mask.tobytes()) in self.seen


def _accepts_after(m: LLMatcher, token: int) -> bool:
    if m.try_consume_tokens([token]) != 1:
        return False
    done = m.is_accepting()
    m.rollback(1)
    return done


def _first_allowed(mask: np.ndarray, words: int) -> np.ndarray:
    """Allowed token ids in the first `words` non-zero words of `mask` (all of them when
    fewer are non-zero): enough to pick from without unpacking the whole vocabulary."""
    nonzero = np.flatnonzero(mask)[:words]
    bits = np.unpackbits(mask[nonzero].view(np.uint8), bitorder="little").reshape(len(nonzero), 32)
    rows, cols = np.nonzero(bits)
    return nonzero[rows] * 32 + cols


def _has(bits: np.ndarray, token: int) -> bool:
    return bool((int(bits[token >> 5]) >> (token & 31)) & 1)


def _single_tokens(tokenizer, strings: list, vocab_size: int) -> np.ndarray:
    """The ids of the strings that are one token each, in the strings' order."""
    ids: list = []
    for s in strings:
        enc = tokenizer.encode(s, add_special_tokens=False)
        if len(enc) == 1 and enc[0] < vocab_size and enc[0] not in ids:
            ids.append(enc[0])
    return np.array(ids, dtype=np.int64)
