"""The Python cost per row of the llguidance step hooks, apart from llguidance's own work (no model).

256 JSON rows (the schema of benchmarks/constrained_gpu.py, the default model's tokenizer) take a
few uniformly drawn tokens, then, with the matchers held at that state:

- `jump`: the jump hook (`GrammarBackend.jump_forward`) on the rows with nothing to force, against
  llguidance's `compute_ff_tokens` alone on the same rows (repeated at one state, so llguidance's
  figure is its cached cost: a first call at a new state costs more);
- `accept`: `LLGuidanceMatcher.accept_rows` for rows off their closing path, far from the budget,
  with llguidance's batched consume replaced by a no-op (the Python loop alone);
- `fill`: `fill_bitmask_rows` over every row with llguidance's batched mask fill a no-op.

`compute_ff_tokens_first_call_us` is llguidance's forced-token call at each walk step's new
states (its cost in a real step, where every state is new). `fill_ms_without_ff` / `fill_ms_after_ff`:
the same 30-step walk twice each, the batched mask fill's median per step when the forced-token
call runs on every row before it (as the scheduler's jump hook does) and when it does not: what
leaving the call out on a row would save (the forced tokens are not consumed: the walks are alike).

    python benchmarks/host_row_cost.py            # medians of 300 repeats, microseconds per row
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from types import SimpleNamespace

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from grammar_host_cost import MAX_NEW, SCHEMA, VOCAB, Row  # noqa: E402
from radixflow.constrained import llguidance_grammars  # noqa: E402
from radixflow.constrained.backend import GrammarBackend  # noqa: E402
from radixflow.constrained.batch_mask import accept_tokens, fill_bitmask_rows, new_bitmask  # noqa: E402

ROWS, WALK, REPEATS = 256, 12, 300


def us_per_row(fn, rows: int) -> float:
    def once() -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    return 1e6 * statistics.median(once() for _ in range(REPEATS)) / rows


def walk(backend: GrammarBackend, spec: str, steps: int, seed: int, after_accept) -> tuple:
    """ROWS rows, `steps` uniformly drawn tokens each; `after_accept(rows)` runs after each step's
    accept. Returns the rows still live and the fill's seconds per step."""
    rows = [Row("json_schema", spec, MAX_NEW) for _ in range(ROWS)]
    for r in rows:
        backend.submit(r)
        assert backend.poll(r) is True, r.finish_reason
    rng = np.random.default_rng(seed)
    bitmask = new_bitmask(ROWS, (VOCAB + 31) // 32, pinned=False)
    fills = []
    for _ in range(steps):
        t = time.perf_counter()
        fill_bitmask_rows(bitmask, [(i, r.grammar) for i, r in enumerate(rows)])
        fills.append(time.perf_counter() - t)
        bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")[:, :VOCAB]
        picks = [int(rng.choice(np.flatnonzero(bits[i]))) for i in range(ROWS)]
        for r, t in zip(rows, picks):
            r.output_ids.append(t)
        accept_tokens([(r.grammar, t) for r, t in zip(rows, picks)])
        after_accept([r for r in rows if not r.grammar.is_terminated()])
    return [r for r in rows if not r.grammar.is_terminated()], fills


def forced_tokens(rows: list) -> None:
    for r in rows:
        r.grammar.m.compute_ff_tokens()


def walked_rows(backend: GrammarBackend, spec: str, first_ff: list) -> list:
    """WALK steps (off the grammar's first forced run); appends to `first_ff` the seconds per row of
    `compute_ff_tokens` at each step's new states (its first call there)."""

    def timed_ff(rows: list) -> None:
        t = time.perf_counter()
        forced_tokens(rows)
        first_ff.append((time.perf_counter() - t) / len(rows))

    return walk(backend, spec, WALK, 0, timed_ff)[0]


def fill_ms(backend: GrammarBackend, spec: str, with_ff: bool) -> float:
    fills = walk(backend, spec, 30, 1, forced_tokens if with_ff else lambda rows: None)[1]
    return 1e3 * statistics.median(fills[1:])


class NoWork:
    """llguidance's executor with no work done: what is left is the Python around it."""

    def consume_token_par(self, pairs: list) -> list:
        return [True] * len(pairs)

    def unsafe_compute_mask_ptr(self, *args) -> None:
        return None


def main() -> None:
    from transformers import AutoTokenizer

    from radixflow.model_files import resolve_model

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(resolve_model(None).path)
    args = SimpleNamespace(grammar_backend="llguidance", disable_jump_forward=False, grammar_compile_timeout_s=300.0)
    backend = GrammarBackend(tok, VOCAB, {2}, args)
    spec = json.dumps(SCHEMA)
    backend.compile("json_schema", spec)
    fills = {ff: [round(fill_ms(backend, spec, ff), 3) for _ in range(2)] for ff in (False, True)}
    first_ff: list = []
    rows = walked_rows(backend, spec, first_ff)
    # rows the hook would move (forced tokens, a pending cut) are left out: the state must stay put
    still = [r for r in rows if not r.grammar.m.compute_ff_tokens() and not r.grammar.undo]
    hook = us_per_row(lambda: [backend.jump_forward(r) for r in still], len(still))
    ff = us_per_row(lambda: [r.grammar.m.compute_ff_tokens() for r in still], len(still))
    far = [r.grammar for r in rows if r.grammar.path is not None]
    token = 17  # no path here starts with it: every row takes follow()'s off-path case
    assert all(m.path[:1] != [token] for m in far)
    pairs = [(m, token) for m in far]
    llguidance_grammars.executor = NoWork  # the loops alone: llguidance's consume and masks are no-ops
    bitmask = new_bitmask(len(rows), (VOCAB + 31) // 32, pinned=False)
    fill = us_per_row(lambda: fill_bitmask_rows(bitmask, [(i, r.grammar) for i, r in enumerate(rows)]), len(rows))

    def accept() -> None:
        for m in far:
            m.since = 1  # off the path, far from the budget: counted, verified later
        llguidance_grammars.LLGuidanceMatcher.accept_rows(pairs)

    loop = us_per_row(accept, len(far))
    print(json.dumps({"jump_rows": len(still), "jump_hook_us": round(hook, 3), "compute_ff_tokens_us": round(ff, 3),
                      "jump_python_us": round(hook - ff, 3),
                      "compute_ff_tokens_first_call_us": round(1e6 * statistics.median(first_ff), 3),
                      "fill_python_us": round(fill, 3),
                      "fill_ms_without_ff": fills[False], "fill_ms_after_ff": fills[True], "accept_rows": len(far), "accept_python_us": round(loop, 3)}))  # fmt: skip
    backend.cache.pool.shutdown(wait=False)


if __name__ == "__main__":
    main()
