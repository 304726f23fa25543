"""Host cost of one stop check per token for an unbounded stop_regex pattern (no longest match: `+`, `*`, `{n,}`),
early (tokens 1-100) and late (the last 100 of a gen well past the 4,096-character window), timed two ways in the
same run on the same text: as radixflow searches now (from where a match could still start: stop_regex_search.py)
and from the window's start at every check, as before session 30 (the same StopChecker with the incremental search
switched off: each pattern searched with `re` over the window). The scheduler runs this check for every such
request on every step.

    python benchmarks/stop_regex_cost.py [--tokens 3000]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time

from radixflow.model_files import load_tokenizer, resolve_model
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.scheduling.req import Req
from radixflow.runtime.scheduling.stop_checker import StopChecker

PATTERNS = [r"[A-Z]{3,}", r"\w+@\w+\.com", r"(?i)answer:\s*\d+", r"\n\d+\.", r"START.*END"]
WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but have "
         "an they you were her she there been one all we their has would when if so no what up out about who").split()


def run(tok, ids: list, pattern: str, incremental: bool, span: int) -> tuple[float, float]:
    """µs per check over the first and the last `span` tokens of `ids`."""
    params = SamplingParams.from_dict({"max_new_tokens": 10**6, "stop_regex": pattern})
    if not incremental:
        params.stop_patterns = dataclasses.replace(params.stop_patterns, growing=(None,))
    checker, req = StopChecker(tok, eos_ids=set()), Req("r", [1], params, output_ids=[])
    times = []
    for t in ids:
        req.output_ids.append(t)
        t0 = time.perf_counter()
        checker.check(req, seq_limit=10**7)
        times.append(time.perf_counter() - t0)
        assert not req.finished, f"{pattern} matched the benchmark's text"
    return 1e6 * sum(times[:span]) / span, 1e6 * sum(times[-span:]) / span


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=3000)
    ap.add_argument("--span", type=int, default=100)
    args = ap.parse_args()
    tok = load_tokenizer(resolve_model(None).path)
    rng = random.Random(0)
    text = " ".join(rng.choice(WORDS) for _ in range(args.tokens))
    ids = tok.encode(text, add_special_tokens=False)[: args.tokens]
    print(f"{len(ids)} tokens, {len(tok.decode(ids))} characters; µs per check, early / late")
    print(f"{'pattern':22s} {'now':>16s} {'whole window':>16s} {'late, before/now':>17s}")
    for pattern in PATTERNS:
        now = run(tok, ids, pattern, True, args.span)
        before = run(tok, ids, pattern, False, args.span)
        print(f"{pattern:22s} {now[0]:7.1f} / {now[1]:6.1f} {before[0]:7.1f} / {before[1]:6.1f} {before[1] / now[1]:16.1f}x")


if __name__ == "__main__":
    main()
