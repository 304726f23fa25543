"""How much of its token budget a request that may stop early (EOS, stop ids or strings, a grammar) will
still use, learned from the requests that finished and those still running (kv_reserve.py's peak rule).

A plain mean over finished requests is biased low where it matters: the short requests finish first, so
right after a burst of arrivals the mean says "a tenth of the budget" while the long ones are all still
running (and admitting on it over-fills the pool). So the length distribution, as a fraction of the
budget, is a Kaplan-Meier estimate on a grid: the last WINDOW finished requests are events, the running
ones are censored at the fraction they have used so far. Where no request is known to have ended, the
survivors are taken to run to their budget (before anything has finished: every budget in full). A
running request's expected remaining fraction is then E[L - used | L > used], from its own age: one that
has run long is likely a long one. A fixed-length request (ignore_eos and no stops) is not estimated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

GRID = 64  # fractions of the budget, in bins of 1/64
WINDOW = 256  # finished requests remembered
FLOOR = 0.1  # an estimate never goes below this fraction of the budget (nor above what is left of it)


def grid_bins(fraction: np.ndarray) -> np.ndarray:
    return np.clip((fraction * GRID).astype(np.int64), 0, GRID - 1)


@dataclass
class StopLengths:
    done: np.ndarray = field(default_factory=lambda: np.empty(0))  # used fractions of the last finished ones
    seen: int = 0

    def observe(self, used: float) -> None:
        self.seen += 1
        self.done = np.append(self.done[-(WINDOW - 1) :], min(max(used, 0.0), 1.0))

    def remaining(self, used: np.ndarray) -> np.ndarray:
        """Expected fraction of the budget still to come, for requests running at `used` fractions
        (censored observations, also) and, at index len(used), for a request not started yet."""
        bins = grid_bins(used)
        events = np.bincount(grid_bins(self.done), minlength=GRID)
        at_risk = np.cumsum((events + np.bincount(bins, minlength=GRID))[::-1])[::-1] + 1  # + 1: a hazard stays < 1
        survive = np.cumprod(1.0 - events / at_risk)  # P(L beyond bin k)
        before = np.concatenate(([1.0], survive[:-1]))  # P(L beyond bin k's start)
        tail = np.cumsum(before[::-1])[::-1] / GRID  # E[(L - start of bin k)+], each bin at its start's survival
        expect = tail / before
        return np.maximum(np.append(expect[bins] - (used - bins / GRID), expect[0]), FLOOR)
