r"""A short completion to an accepting state, found by search over llguidance matcher states.

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
one already seen in that lexeme made no visible progress: it is undone and passed over while
another token is allowed (an email's local part takes one character, then the others are
tried until `@` opens the domain). It may count, though: once a few tokens were passed over,
or every allowed whole-character one was, such a token is taken again, round after round,
with the tokens since the point where the walk saw that mask (in `\d{3}` a digit leaves the
mask as it was; in `(\d+\.){3}\d+`, after `1.`, `0` then `.` go back to the digits-only mask).
Progress is the output complete or a token allowed that the first round did not allow at the
same point (the literal after the count); the fewest copies that make it are kept. A lone
token repeats before a longer round does, so that tokens that progress alone come first
(` t`, a space and a word, before ` `, `a`). Tokens that end inside a UTF-8 character (a
byte of `٢`, a digit to `\d`) are tried last: their masks always look new (session 31: the
walk found no path after `1.` above and wrote `٢۱߀`, 6 tokens, where `111` closes `\d{3}`,
so streamed and whole requests parted).
Where masks show no progress (an unanchored `pattern`, a long `minLength`), sample strings
from the grammar's spec (closing_hints.py, as `hints`: token lists) are tried wherever a
string opens (after a token that ends with `"`, and at the start): one the matcher accepts, after which the string may close, is
taken whole.
The walk consumes on the matcher itself and rolls back before returning. Its length
bounds the distance to acceptance from above; it is not always the shortest completion.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Optional

import numpy as np
from llguidance import LLMatcher

from radixflow.constrained.options import TokenizerInfo
from radixflow.constrained.vocabulary import token_to_bytes, tokenizer_kind

PROBE_WORD = "the"  # allowed inside free string content, nowhere else in JSON
STRUCTURE = "{}[],:"  # one of these allowed: between JSON values, not inside a string or number
FALLBACK_TRIES = 8  # lowest-id allowed tokens tried for one that completes the output at once
MAX_PICKS = 512  # mask computations per search: a walk that needs more gives up
REPEATS = 32  # tokens a repeated round (or token) takes at most
LONE_REPEATS = 256  # copies of a lone token the last walk repeats (32 missed `.{60}!`, which session 30's walk found)
REPEAT_AFTER = 24  # a lone token repeats once this many others were passed over (`ed` for 2 hex digits first)
ROUND_AFTER = 48  # a round repeats once this many tokens were passed over, or all whole-character ones were
MAX_CYCLE = 8  # a round longer than this back to a mask seen before is not repeated
NEW, PROBE, ANYWAY = "new", "probe", "anyway"  # how `_pick` took a token


def _closers(alphabet: str, first: str = "") -> list:
    """Strings over `alphabet` (prefixed with `first`), longest first."""
    return [first + "".join(p) for n in (3, 2, 1, 0) for p in itertools.product(alphabet, repeat=n) if first or n]


def string_preferences() -> list:
    return _closers("}]", '"') + ['":', '",'] + structural_preferences()


def structural_preferences() -> list:
    values = ["0", '""', "[]", "{}", "null", "true", "false"]
    # separators before values: after a number, `,` ends it where `0` would extend it
    return _closers("}]") + [",", ":"] + values + ['"', ',"', ':"', '{"', '["', "{", "["]


@dataclass(frozen=True, eq=False)
class Lead:
    """A thinking block's end marker as tokens, and the mask where the grammar after the block starts."""

    tokens: tuple
    mask: np.ndarray


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
        self.whole = _packed(_whole_characters(info.tokenizer, pieces), self.words)

    def find(self, m: LLMatcher, limit: int, hints: tuple = (), lead: Optional[Lead] = None) -> Optional[list]:
        r"""Tokens from `m`'s state to an accepting one, at most `limit` of them; None if
        the walk finds none. `m` is left in the state it was in. Where the walk finds none, a second one first
        takes any of the lowest-id allowed tokens after which the output is complete: the preferences lead a regex
        such as `( [a-z]+,)+ [a-z]+\.` round its loop (`a`, `,`, ` `, ...) and never to its `.` (fuzzing, session
        30: a streamed request, checked at every token, lost the model's tokens to the old path far from its
        budget). Where that finds none either, a third lets a lone token repeat up to LONE_REPEATS times, not
        REPEATS (`.{60}!`: a count past 32 of single characters; the first walks' shorter paths of longer tokens
        come first where they exist). `lead`: a thinking block's end marker before its grammar (after_thinking.py:
        free text shows the walk no progress), which each walk takes first where it ends the block."""
        for close_first, lone in ((False, REPEATS), (True, REPEATS), (True, LONE_REPEATS)):
            path = self._walk(m, limit, hints, close_first, lone, lead)
            if path is not None:
                return path
        return None

    def _walk(self, m: LLMatcher, limit: int, hints: tuple, close_first: bool, lone: int, lead: Optional[Lead]) -> Optional[list]:
        path: list = self._take_lead(m, lead, limit)
        begin = len(path)  # where the grammar's own search starts (after a block's end marker)
        walk = _Walk()
        hinted = -1  # the path length at which hints were last tried (once per string opening)
        for _ in range(min(2 * limit + 16, MAX_PICKS)):
            if m.is_accepting() or len(path) >= limit:
                break
            if hints and hinted != len(path) and (len(path) == begin or self.opens_string[path[-1]]):
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
                walk.arrive(self._mask(m), self._in_lexeme, len(path))
            token, mode = self._pick(m, walk, close_first)
            if token is None or not m.consume_token(token):
                break
            path.append(token)
            if m.is_accepting() or mode == ANYWAY:
                walk.mask = None
                continue
            after = self._mask(m)
            start = walk.seen_at(after, self._in_lexeme)
            if start is not None:  # back at a mask seen before: no progress, unless it counts
                after, here = None, len(path) - 1
                if mode == PROBE and start < here and (start, here) not in walk.rounds:  # the round since there
                    walk.rounds.add((start, here))
                    after = self._repeat(m, walk, path, start, limit, lone)
                elif start < here:  # repeated later: tokens that progress alone (` t`, a space and a word) first
                    walk.rounds_here.setdefault(start, token)
                if after is None and (len(walk.skip) >= REPEAT_AFTER or mode == PROBE):  # the token alone
                    after = self._repeat(m, walk, path, here, limit, lone)
            if after is None:  # no progress: undo it, try another token
                m.rollback(1)
                path.pop()
                walk.skip.add(token)
                if mode == PROBE:
                    walk.probed.add(token)
            else:
                walk.arrive(after, self._in_lexeme, len(path))
        found = m.is_accepting() and not m.is_error()
        m.rollback(len(path))
        return path if found else None

    def _repeat(self, m: LLMatcher, walk: "_Walk", path: list, start: int, limit: int, lone: int) -> Optional[np.ndarray]:
        r"""The tokens since `start` (where the walk saw the mask it is back at) left no visible
        progress: take them again, round and round, up to REPEATS tokens (a lone token: `lone`), in case they count
        (`[0-9]{5}`; `(\d+\.){3}`, where `0` and `.` go back to the masks of the first round).
        Progress: the output complete, or a token allowed that was not at the same point of
        the first round (`-` after `[0-9]{3}`; reaching the bound of `[a-z]{1,20}` only takes
        tokens away), checked where the copies end (the last mask; `is_accepting` each
        token). Then the fewest copies that make the progress join `path`, and the mask there
        is returned. None: no progress, or the round is longer than MAX_CYCLE."""
        cycle = path[start:]
        first = [walk.trail.get(p) for p in range(start + 1, len(path))] + [walk.trail.get(start)]
        if len(cycle) > MAX_CYCLE or any(f is None for f in first):
            return None
        most = lone if len(cycle) == 1 else REPEATS
        seq = (cycle * (most // len(cycle) + 1))[: min(most, limit - len(path))]
        n = m.try_consume_tokens(seq)
        m.rollback(n)
        k = 0
        while k < n and not m.is_accepting():
            m.consume_token(seq[k])
            k += 1
        progress = k and self._opens(m, first[(k - 1) % len(cycle)])
        m.rollback(k)
        if not progress:
            return None
        for j in range(1, k + 1):
            m.consume_token(seq[j - 1])
            mask = self._mask(m)
            if m.is_accepting() or bool(np.any(mask & ~first[(j - 1) % len(cycle)])):
                path.extend(seq[:j])
                return mask
            walk.trail[len(path) + j] = mask
        raise AssertionError("the same copies opened a token before")

    def _opens(self, m: LLMatcher, before: np.ndarray) -> bool:
        return m.is_accepting() or bool(np.any(self._mask(m) & ~before))

    def lead(self, m: LLMatcher, opening: list, marker: list) -> Optional[Lead]:
        """A block's end `marker` (tokens) with the mask where the grammar after the block starts: from `m`'s state (a
        fresh matcher), after the block's `opening` (tokens; none where the output starts inside it) and the marker."""
        at = m.deep_copy()
        if at.try_consume_tokens(opening + marker) != len(opening) + len(marker):
            return None
        return Lead(tuple(marker), self._mask(at))

    def _take_lead(self, m: LLMatcher, lead: Optional[Lead], limit: int) -> list:
        """The lead's tokens, consumed on `m`, where they end the thinking block: `m` allows them all and is then where
        the grammar after the block starts (its mask); else [] and `m` unchanged (an answer that allows the marker's
        text, a JSON string, must not get it)."""
        if lead is None or len(lead.tokens) > limit or m.is_accepting():
            return []
        done = m.try_consume_tokens(list(lead.tokens))
        if done == len(lead.tokens) and np.array_equal(self._mask(m), lead.mask):
            return list(lead.tokens)
        m.rollback(done)
        return []

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

    def _pick(self, m: LLMatcher, walk: "_Walk", close_first: bool = False) -> tuple:
        """(token, mode): NEW, a token to try; PROBE, a token passed over, taken again to be
        repeated (`_repeat`): one that went back to an earlier point's mask, once ROUND_AFTER
        tokens were passed over or every allowed whole-character one was, then one of the
        latter, before tokens that end inside a character are tried; ANYWAY, those were passed
        over too, so this one is taken even though it makes no visible progress. close_first:
        a token of the lowest-id allowed ones that completes the output comes before the rest."""
        mask, skip = walk.mask, walk.skip
        if close_first:
            ids = _first_allowed(mask, FALLBACK_TRIES)  # up to 32 a word: the first FALLBACK_TRIES are tried
            done = next((t for t in ids[~np.isin(ids, self.eos_ids)][:FALLBACK_TRIES].tolist() if _accepts_after(m, t)), None)
            if done is not None:
                return done, NEW
        bits = mask.view(np.uint32)
        prefs = self.in_string if self._in_string(mask) else self.structural
        allowed = (bits[prefs >> 5] >> (prefs & 31).astype(np.uint32)) & 1
        for i in np.flatnonzero(allowed)[: len(skip) + 1].tolist():
            if int(prefs[i]) not in skip:
                return int(prefs[i]), NEW
        words = FALLBACK_TRIES + len(skip) + len(self.eos_ids) + 1
        whole = self._lowest(mask & self.whole, words)
        fresh = whole[~np.isin(whole, list(skip))] if skip else whole
        # repeating: not the lowest (`0`), so digit runs are not all zeros (year 0000 is no date)
        again = np.concatenate([whole[1:], whole[:1]])[:FALLBACK_TRIES].tolist()
        mode = NEW
        rounds = [t for t in walk.rounds_here.values() if t not in walk.probed]
        if rounds and (not fresh.size or len(skip) >= ROUND_AFTER):
            return rounds[0], PROBE
        if not fresh.size:
            probe = next((t for t in again if t not in walk.probed), None)
            if probe is not None:
                return probe, PROBE
            partial = self._lowest(mask & ~self.whole, words)
            fresh = partial[~np.isin(partial, list(skip))]
            if not fresh.size:
                mode = ANYWAY
                again = again or np.concatenate([partial[1:], partial[:1]])[:FALLBACK_TRIES].tolist()
        first = again if mode == ANYWAY else fresh[:FALLBACK_TRIES].tolist()
        return next((t for t in first if _accepts_after(m, t)), first[0] if first else None), mode

    def _lowest(self, mask: np.ndarray, words: int) -> np.ndarray:
        ids = _first_allowed(mask, words)
        return ids[~np.isin(ids, self.eos_ids)]


class _Walk:
    """Where the walk is within one stretch of a lexeme (string or number) or of structure:
    the current state's mask, where in the path each mask was last seen (`at`) and the
    mask at each point (`trail`), the tokens passed over and those repeated in vain."""

    def __init__(self):
        self.mask, self.inside = None, None
        self.at: dict = {}
        self.trail: dict = {}
        self.skip: set = set()
        self.probed: set = set()
        self.rounds: set = set()  # (from, to): rounds repeated
        self.rounds_here: dict = {}  # an earlier point: a token passed over here that went back to its mask

    def arrive(self, mask: np.ndarray, in_lexeme, where: int) -> None:
        inside = in_lexeme(mask)
        if inside != self.inside:  # into or out of a lexeme: nothing seen here yet
            self.inside, self.at, self.trail, self.skip, self.probed, self.rounds = inside, {}, {}, set(), set(), set()
        self.mask, self.rounds_here = mask, {}
        self.at[hash(mask.tobytes())] = where
        self.trail[where] = mask

    def seen_at(self, mask: np.ndarray, in_lexeme) -> Optional[int]:
        """Where in the path `mask` was last seen in this lexeme; None if it was not."""
        return self.at.get(hash(mask.tobytes())) if self.inside and in_lexeme(mask) else None


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


def _whole_characters(tokenizer, pieces: list) -> np.ndarray:
    """Per token: its bytes are whole UTF-8 characters (not a byte of one, as in `٢` = two
    tokens). Once per tokenizer: a loop over the vocabulary is fine here."""
    kind = tokenizer_kind(tokenizer)

    def whole(piece) -> bool:
        if kind == "byte_level" and piece and piece.isascii():  # ASCII bytes, as they are
            return True
        try:
            return bool(piece) and bool(token_to_bytes(piece, kind).decode("utf-8"))
        except UnicodeDecodeError:
            return False

    return np.array([whole(p) for p in pieces], dtype=bool)


def _packed(flags: np.ndarray, words: int) -> np.ndarray:
    bits = np.zeros(words * 32, dtype=bool)
    bits[: len(flags)] = flags
    return np.packbits(bits, bitorder="little").view(np.int32)


def _single_tokens(tokenizer, strings: list, vocab_size: int) -> np.ndarray:
    """The ids of the strings that are one token each, in the strings' order."""
    ids: list = []
    for s in strings:
        enc = tokenizer.encode(s, add_special_tokens=False)
        if len(enc) == 1 and enc[0] < vocab_size and enc[0] not in ids:
            ids.append(enc[0])
    return np.array(ids, dtype=np.int64)
