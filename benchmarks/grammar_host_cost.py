"""Host work per decode step for a batch of constrained rows, per grammar backend, with no model.

Each step does what the scheduler does for its constrained rows, timed in two parts: `fill`
(one packed bitmask for all rows: `fill_bitmask_rows`) and `advance` (the batch's tokens
accepted in one call per backend, then per row the jump hook: forced tokens, the closing-path check on llguidance). The token
is drawn uniformly among the allowed ones (an adversarial model: long strings, long outputs).
The default model's tokenizer, the schema and regex of benchmarks/constrained_gpu.py.

    python benchmarks/grammar_host_cost.py --rows 64,256 --backends llguidance,outlines
    python benchmarks/grammar_host_cost.py --threads 1,4,8,12 --kinds json_schema   # llguidance's threads and builds
    python benchmarks/grammar_host_cost.py --rows 256 --steps 40 ...                 # the first 40 steps only

`searches` counts llguidance's closing-path searches, `cut_tokens` the outputs a failed budget
check cut back (rewritten tokens the GPU computed for nothing), `accepting_rows` the rows whose
matcher ended in an accepting state (the output is complete for the grammar).
"""

from __future__ import annotations

import argparse
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

from constrained_gpu import MAX_NEW, REGEX, SCHEMA  # noqa: E402
from radixflow.constrained.backend import GrammarBackend, apply_jump  # noqa: E402
from radixflow.constrained.batch_mask import accept_tokens, fill_bitmask_rows, new_bitmask  # noqa: E402

VOCAB = 49152


class Row:
    """What the hooks read of a request."""

    def __init__(self, kind: str, spec: str, budget: int):
        self.sampling = SimpleNamespace(grammar=(kind, spec), max_new_tokens=budget)
        self.output_ids, self.segment_start, self.jump_forward_tokens = [], 0, 0
        self.grammar, self.finish_reason, self.streamed = None, None, False

    @property
    def segment_len(self) -> int:
        return len(self.output_ids)

    def finish(self, reason: dict) -> None:
        self.finish_reason = reason


def run(backend: GrammarBackend, kind: str, spec: str, n: int, seed: int, max_steps: int = 0) -> dict:
    rows = [Row(kind, spec, MAX_NEW) for _ in range(n)]
    backend.compile(kind, spec)
    for r in rows:
        backend.submit(r)
        assert backend.poll(r) is True, r.finish_reason
    rng = np.random.default_rng(seed)
    bitmask = new_bitmask(n, (VOCAB + 31) // 32, pinned=False)
    fill_s, accept_s, advance_s, live_rows, cut = [], [], [], [], 0
    searches = SEARCHES[0]
    while True:
        live = [i for i, r in enumerate(rows) if not r.grammar.is_terminated() and r.segment_len < MAX_NEW]
        if not live or (max_steps and len(fill_s) >= max_steps):
            break
        bitmask.fill_(-1)
        t = time.perf_counter()
        fill_bitmask_rows(bitmask, [(i, rows[i].grammar) for i in live])
        fill_s.append(time.perf_counter() - t)
        bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")[:, :VOCAB]
        picks = {i: int(rng.choice(np.flatnonzero(bits[i]))) for i in live}
        t = time.perf_counter()
        for i in live:
            rows[i].output_ids.append(picks[i])
        accept_tokens([(rows[i].grammar, picks[i]) for i in live])
        accept_s.append(time.perf_counter() - t)
        for i in live:
            r = rows[i]
            if r.grammar.is_terminated() or r.segment_len >= MAX_NEW:
                continue
            cut += apply_jump(r.output_ids, backend.jump_forward(r))
        advance_s.append(time.perf_counter() - t)
        live_rows.append(len(live))
    full = [k for k, m in enumerate(live_rows) if m == n]  # steps with every row live
    ms = lambda xs: 1e3 * statistics.median(xs) if xs else None  # noqa: E731
    return {"rows": n, "steps": len(fill_s), "full_steps": len(full),
            "fill_ms_p50": ms([fill_s[k] for k in full]), "accept_ms_p50": ms([accept_s[k] for k in full]),
            "advance_ms_p50": ms([advance_s[k] for k in full]), "advance_ms_mean": 1e3 * statistics.mean(advance_s),
            "fill_ms_mean": 1e3 * statistics.mean(fill_s), "accept_ms_mean": 1e3 * statistics.mean(accept_s),
            "searches": SEARCHES[0] - searches, "cut_tokens": cut, "accepting_rows": sum(r.grammar.is_accepting for r in rows),
            "fill_ms_max": 1e3 * max(fill_s), "advance_ms_max": 1e3 * max(advance_s),
            "mean_output_tokens": statistics.mean(len(r.output_ids) for r in rows)}  # fmt: skip


SEARCHES = [0]


def count_searches() -> None:
    from radixflow.constrained.closing_path import ClosingSearch

    find = ClosingSearch.find

    def counted(self, *args, **kw):
        SEARCHES[0] += 1
        return find(self, *args, **kw)

    ClosingSearch.find = counted


def use_threads(n: int) -> None:
    """llguidance's batched calls on a pool of `n` threads (0: llguidance's default)."""
    from radixflow.constrained.llguidance_threads import set_threads

    set_threads(n)


def warm_builds(backend: GrammarBackend, kind: str, spec: str, n: int) -> int:
    """Hands out `n` requests (untimed) so that the grammar makes the builds this pool size
    allows, and waits for them: the timed run's rows copy them in turn. How many it uses."""
    from radixflow.constrained.llguidance_threads import max_builds

    grammar = backend.compile(kind, spec)
    for _ in range(n):
        r = Row(kind, spec, MAX_NEW)
        backend.submit(r)
        assert backend.poll(r) is True, r.finish_reason
    return min(grammar.wait_for_builds(), max_builds())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="64,256")
    ap.add_argument("--backends", default="llguidance,outlines")
    ap.add_argument("--kinds", default="json_schema,regex")
    ap.add_argument("--threads", default="0", help="llguidance executor threads, comma-separated (0: its default); each "
                    "also sets the grammar's builds (min(threads, CPUs)), made before the timed run")
    ap.add_argument("--tokenizer", help="the default model's tokenizer folder (default: its converted cache folder)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--steps", type=int, default=0, help="stop each run after this many steps (0: when every row ends)")
    a = ap.parse_args()
    count_searches()
    from transformers import AutoTokenizer

    if a.tokenizer is None:
        from radixflow.model_files import resolve_model

        a.tokenizer = resolve_model(None).path
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    torch.set_num_threads(1)
    out = []
    for name in a.backends.split(","):
        backend = GrammarBackend(tok, VOCAB, {2}, SimpleNamespace(grammar_backend=name, disable_jump_forward=False, grammar_compile_timeout_s=300.0))
        for kind in a.kinds.split(","):
            spec = json.dumps(SCHEMA) if kind == "json_schema" else REGEX
            for n in (int(x) for x in a.rows.split(",")):
                for threads in [int(x) for x in a.threads.split(",")] if name == "llguidance" else [0]:
                    use_threads(threads)
                    builds = warm_builds(backend, kind, spec, n) if name == "llguidance" else 1
                    res = {"backend": name, "kind": kind, "threads": threads, "builds": builds,
                           **run(backend, kind, spec, n, seed=n, max_steps=a.steps)}
                    out.append(res)
                    print(json.dumps(res), flush=True)
        backend.cache.pool.shutdown(wait=False)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
