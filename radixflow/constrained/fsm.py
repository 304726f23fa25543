"""A regex compiled into a token-level FSM (outlines-core `Index`), plus what the
runtime needs per state, computed once per grammar:

- `dist[s]`: the fewest tokens from state s to an accepting state (budget-aware completion);
- per state, its allowed tokens sorted by the distance of the state they lead to, so the
  tokens that keep a request within a token budget are a prefix of that array;
- cached packed masks (full, and budget-limited), and forced continuations (jump-forward).

Masks are built from these arrays the first time a state is seen and copied from the
cache afterwards; nothing on the per-token path loops over the vocabulary.

outlines-core 0.2.14 leaves out of its index every token whose bytes, all but the last,
end where the regex may end, and whose last byte leads on (regex `a(;c)?`: after `a`, the
token `;` is missing, so a second item can never start). So each regex is indexed with an
end marker after it, `(?:REGEX)\x00`, over a vocabulary without NUL bytes: the regex can then
never end inside a real token and no transition is lost. A state accepts when the marker
leads from it to the end.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import numpy as np
from outlines_core import Guide, Index

from radixflow.constrained.vocabulary import END_TOKEN, NO_BYTE, TokenVocab

INF = 1 << 20  # distance of a state that cannot reach acceptance
MAX_FORCED_BYTES = 4096


@dataclass(eq=False)
class CompiledGrammar:
    regex: str
    index: Index
    vocab: TokenVocab
    states: np.ndarray  # [S] sorted outlines state ids; dense index = position
    final: np.ndarray  # [S] bool
    terminal: np.ndarray  # [S] bool: accepting, and nothing but EOS may follow
    dist: np.ndarray  # [S] int64
    max_next: np.ndarray  # [S] int64: largest dist among the states a token leads to
    offsets: np.ndarray  # [S+1] into tokens / next_dist
    tokens: np.ndarray  # [T] int32, per state sorted by next_dist
    next_dist: np.ndarray  # [T] int64
    compile_s: float = 0.0
    _dense: dict = field(default_factory=dict, repr=False)
    _tight: dict = field(default_factory=dict, repr=False)
    _forced: dict = field(default_factory=dict, repr=False)
    _extendable: dict = field(default_factory=dict, repr=False)
    only_first_byte: np.ndarray = field(init=False, repr=False)  # [S] int16, built from tokens (_only_first_byte)

    def __post_init__(self) -> None:
        self._dense = {int(s): i for i, s in enumerate(self.states)}
        self.only_first_byte = _only_first_byte(self.vocab.first_byte[self.tokens], self.offsets)

    @property
    def initial_state(self) -> int:
        return self.index.get_initial_state()

    @property
    def min_tokens(self) -> int:
        """The fewest tokens of any output this grammar accepts."""
        return int(self.dist[self.dense(self.initial_state)])

    def dense(self, state: int) -> int:
        return self._dense[state]

    def new_guide(self, max_rollback: int = 8) -> Guide:
        return Guide(self.index, max_rollback=max_rollback)

    # -- masks --------------------------------------------------------------------------------
    def full_mask(self, guide: Guide) -> np.ndarray:
        """[W] int32 mask of the guide's current state (cached per state)."""
        return self.budget_mask(guide.get_state(), INF - 1)  # the tokens after which acceptance is reachable

    def budget_mask(self, state: int, within: int) -> np.ndarray:
        """[W] int32 mask of tokens after which an accepting state is at most `within`
        tokens away (EOS too, in an accepting state); cached per (state, within)."""
        key = (state, within)
        mask = self._tight.get(key)
        if mask is None:
            i = self.dense(state)
            lo, hi = self.offsets[i], self.offsets[i + 1]
            keep = int(np.searchsorted(self.next_dist[lo:hi], within, side="right"))
            bits = np.zeros(self.vocab.words * 32, dtype=bool)
            bits[self.tokens[lo : lo + keep]] = True
            if self.final[i]:
                bits[list(self.vocab.eos_ids)] = True
            mask = np.packbits(bits, bitorder="little").view(np.int32).copy()
            self._tight[key] = mask
        return mask

    def budget_narrows(self, state: int, within: int) -> bool:
        """Whether the budget mask leaves out a token the grammar allows here (one after
        which acceptance is reachable, just not within `within` more tokens)."""
        i = self.dense(state)
        lo, hi = self.offsets[i], self.offsets[i + 1]
        reachable = int(np.searchsorted(self.next_dist[lo:hi], INF - 1, side="right"))
        return reachable > 0 and int(self.next_dist[lo + reachable - 1]) > within

    # -- jump-forward -------------------------------------------------------------------------
    def forced_bytes(self, state: int) -> bytes:
        """The bytes every accepted continuation from `state` starts with (cached)."""
        out = self._forced.get(state)
        if out is None:
            out = self._walk_forced(state)
            self._forced[state] = out
        return out

    def _walk_forced(self, state: int) -> bytes:
        out = bytearray()
        while len(out) < MAX_FORCED_BYTES:
            i = self.dense(state)
            if self.final[i]:
                break
            first = int(self.only_first_byte[i])
            if first == NO_BYTE:
                break
            tok = int(self.vocab.single_byte_token[first])
            nxt = self.index.get_next_state(state, tok) if tok >= 0 else None
            if nxt is None:
                break
            out.append(first)
            state = nxt
        return bytes(out)

    def extendable(self, state: int, token: int) -> bool:
        """Whether, from `state`, the grammar also allows a longer token that starts with
        `token`'s bytes (e.g. `["` beside `[`): then a jump should not end on `token`, or it
        forces a split the model never saw in training (cached per (state, token))."""
        key = (state, token)
        out = self._extendable.get(key)
        if out is None:
            ext = self.vocab.extensions(token)
            i = self.dense(state)
            allowed = self.tokens[self.offsets[i] : self.offsets[i + 1]]
            out = bool(len(ext)) and bool(np.isin(ext, allowed, assume_unique=True).any())
            self._extendable[key] = out
        return out

    def walk(self, state: int, tokens: list):
        """The state after `tokens`, or None if one of them is not allowed."""
        for t in tokens:
            state = self.index.get_next_state(state, t)
            if state is None:
                return None
        return state


def _only_first_byte(first_bytes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """[S] int16: the first byte every allowed token of a state starts with, else NO_BYTE
    (several first bytes, no tokens, or tokens without bytes); one pass at compile time, so
    jump-forward's walk over a state not seen before costs no scan of its tokens."""
    out = np.full(len(offsets) - 1, NO_BYTE, dtype=np.int16)
    filled = np.flatnonzero(offsets[1:] > offsets[:-1])
    if len(filled):
        starts = offsets[filled]
        lo = np.minimum.reduceat(first_bytes, starts)
        hi = np.maximum.reduceat(first_bytes, starts)
        out[filled] = np.where(lo == hi, lo, NO_BYTE)
    return out


def compile_regex(regex: str, vocab: TokenVocab) -> CompiledGrammar:
    """Raises ValueError (outlines-core's message) when the regex cannot be compiled."""
    marked = "(?:" + regex + ")\\x00"  # the end marker (module docstring)
    try:
        index = Index(marked, vocab.outlines)
    except ValueError as e:
        raise ValueError(str(e).replace(marked, regex)) from None
    trans = index.get_transitions()
    ends = set(index.get_final_states())  # after the marker: no real token leads there
    finals = {s for s, d in trans.items() if d.get(END_TOKEN) in ends}
    states = np.array(sorted((set(trans) | {index.get_initial_state()}) - ends), dtype=np.int64)
    toks, nxts = _flatten(trans, states, vocab.eos_id)
    final = np.isin(states, np.array(sorted(finals), dtype=np.int64))
    dist = _distances(states, toks, nxts, final)
    if dist[np.searchsorted(states, index.get_initial_state())] >= INF:
        raise ValueError(f"The vocabulary provided is incompatible with the regex '{regex}': no token sequence completes it")
    return _assemble(regex, index, vocab, states, final, dist, toks, nxts)


def _flatten(trans: dict, states: np.ndarray, eos_id: int) -> tuple[list, list]:
    """Per dense state: token ids and dense next states (EOS and the end marker left out)."""
    toks, nxts = [], []
    for s in states.tolist():
        d = trans.get(s, {})
        d.pop(eos_id, None)
        d.pop(END_TOKEN, None)
        t = np.fromiter(d.keys(), dtype=np.int32, count=len(d))
        n = np.searchsorted(states, np.fromiter(d.values(), dtype=np.int64, count=len(d)))
        toks.append(t)
        nxts.append(n)
    return toks, nxts


def _distances(states: np.ndarray, toks: list, nxts: list, final: np.ndarray) -> np.ndarray:
    """Breadth-first search backwards from the accepting states over token transitions."""
    preds = collections.defaultdict(set)
    for i, n in enumerate(nxts):
        for j in np.unique(n).tolist():
            preds[j].add(i)
    dist = np.full(len(states), INF, dtype=np.int64)
    frontier = np.nonzero(final)[0].tolist()
    dist[frontier] = 0
    queue = collections.deque(frontier)
    while queue:
        j = queue.popleft()
        for i in preds[j]:
            if dist[i] == INF:
                dist[i] = dist[j] + 1
                queue.append(i)
    return dist


def _assemble(regex, index, vocab, states, final, dist, toks, nxts) -> CompiledGrammar:
    offsets = np.zeros(len(states) + 1, dtype=np.int64)
    all_toks, all_nd, max_next = [], [], np.zeros(len(states), dtype=np.int64)
    for i, (t, n) in enumerate(zip(toks, nxts)):
        nd = dist[n]
        order = np.argsort(nd, kind="stable")
        all_toks.append(t[order])
        all_nd.append(nd[order])
        offsets[i + 1] = offsets[i] + len(t)
        max_next[i] = nd.max() if len(nd) else 0
    terminal = final & (offsets[1:] == offsets[:-1])
    return CompiledGrammar(
        regex=regex,
        index=index,
        vocab=vocab,
        states=states,
        final=final,
        terminal=terminal,
        dist=dist,
        max_next=max_next,
        offsets=offsets,
        tokens=np.concatenate(all_toks) if all_toks else np.zeros(0, dtype=np.int32),
        next_dist=np.concatenate(all_nd) if all_nd else np.zeros(0, dtype=np.int64),
    )
