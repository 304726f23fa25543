"""Scoring rules for `select`: pick one option from the logprobs of its tokens.

`cond[i]` lists the logprobs of option i's tokens after the prompt; `uncond[i]` the
logprobs of the same tokens with no prompt (the first one, having no context, counts 0).
"""

from __future__ import annotations

from typing import Optional

METHODS = ("token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized")


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("-inf")


def token_length_normalized(cond: list[list[float]]) -> int:
    means = [_mean(c) for c in cond]
    return max(range(len(means)), key=lambda i: means[i])


def greedy_token_selection(cond: list[list[float]]) -> int:
    """Compare options token by token, keeping the best at each position until one is
    left; a shorter option is padded with its own mean."""
    width = max(len(c) for c in cond)
    rows = [c + [_mean(c)] * (width - len(c)) for c in cond]
    alive = list(range(len(rows)))
    for pos in range(width):
        best = max(rows[i][pos] for i in alive)
        alive = [i for i in alive if rows[i][pos] == best]
        if len(alive) == 1:
            break
    return alive[0]


def unconditional_likelihood_normalized(cond: list[list[float]], uncond: list[list[float]]) -> int:
    scores = [_mean([c - u for c, u in zip(ci, ui)]) for ci, ui in zip(cond, uncond)]
    return max(range(len(scores)), key=lambda i: scores[i])


def choose(method: str, cond: list[list[float]], uncond: Optional[list[list[float]]] = None) -> int:
    if method == "token_length_normalized":
        return token_length_normalized(cond)
    if method == "greedy_token_selection":
        return greedy_token_selection(cond)
    if method == "unconditional_likelihood_normalized":
        assert uncond is not None, "unconditional scoring needs the unconditional logprobs"
        return unconditional_likelihood_normalized(cond, uncond)
    raise ValueError(f"unknown choices method {method!r}; use one of {', '.join(METHODS)}")


def shared_prefix_scores(scores: list[list[float]], ids: list[list[int]]) -> list[list[float]]:
    """Each choice's scores, where its tokens from the start are an earlier choice's, taken from that choice: the same
    context gives the same logprob, but computed in other rows of other passes it differs in the last digits, which
    flipped greedy_token_selection between a cold and a warm cache (fuzzing, session 29)."""
    trie: dict = {}  # (node, token) -> node; a node is one token-id prefix
    value: dict = {}  # node -> the first score seen for it
    out = []
    for row, toks in zip(scores, ids):
        node, new = 0, list(row)
        for k, tok in enumerate(toks[: len(row)]):
            node = trie.setdefault((node, tok), len(trie) + 1)
            new[k] = value.setdefault(node, row[k])
        out.append(new)
    return out


def score_choices(method: str, cond_rows: list, uncond_rows: list, cids: list[list[int]]) -> tuple[int, dict]:
    """The chosen choice and the select's meta, from each choice's input_token_logprobs after the prompt (`cond_rows`)
    and, for unconditional_likelihood_normalized, alone (`uncond_rows`; empty otherwise): the one scoring both the
    eager backends and the graph executor use."""
    cond = shared_prefix_scores([logprob_values(r) for r in cond_rows], cids)
    uncond = shared_prefix_scores([logprob_values(r) for r in uncond_rows], cids) or None
    return choose(method, cond, uncond), select_meta(cond, uncond)


def select_meta(cond: list[list[float]], uncond: Optional[list[list[float]]]) -> dict:
    meta = {"normalized_prompt_logprobs": [_mean(c) for c in cond], "input_token_logprobs": cond}
    if uncond is not None:
        meta["unconditional_token_logprobs"] = uncond
    return meta


def logprob_values(input_token_logprobs: list) -> list[float]:
    """[[lp|None, id, text], ...] or [(lp|None, id)] -> floats, a missing one counted 0."""
    return [0.0 if t[0] is None else float(t[0]) for t in input_token_logprobs]
