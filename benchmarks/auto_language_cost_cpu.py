"""What `--grammar-backend auto`'s two guarantees cost, on the CPU, for the schema of constrained_gpu.py:

- masks: llguidance compiling the schema natively against compiling outlines' regex of it (what auto does
  for a grammar that may move, so its language stays at the move): `--rows` matchers fed valid instances,
  every row's mask filled a step as the scheduler does, two passes of each (the second printed);
- the move's compile: outlines' token index built in this process against in a child process
  (isolated_compile.py), with the longest wait of a thread that wakes every millisecond (the scheduler's
  stand-in) while it ran.

    python benchmarks/auto_language_cost_cpu.py --rows 64
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import torch  # noqa: E402
from constrained_gpu import SCHEMA  # noqa: E402

from radixflow.constrained import GrammarOptions  # noqa: E402
from radixflow.constrained.batch_mask import accept_tokens, fill_bitmask_rows  # noqa: E402
from radixflow.constrained.fsm import compile_regex  # noqa: E402
from radixflow.constrained.grammar import compile_grammar, grammar_backend, tokenizer_info  # noqa: E402
from radixflow.constrained.isolated_compile import Limits, compile_isolated  # noqa: E402
from radixflow.constrained.spec import to_regex  # noqa: E402

ROLES = ["engineer", "manager", "sales", "other"]


def instance(i: int) -> str:
    doc = {"name": f"Person {i}", "age": i % 100, "email": f"p{i}@example.com", "role": ROLES[i % 4],
           "skills": ["python", "go"][: i % 3], "address": {"city": "Paris", "zip": f"{10000 + i}"}}  # fmt: skip
    return json.dumps(doc, separators=(",", ":"))


def mask_pass(ll, grammar, ids: list, words: int) -> dict:
    matchers = [ll.matcher(grammar) for _ in ids]
    mask = torch.zeros(len(ids), words, dtype=torch.int32)
    steps, fill_s, masks = max(map(len, ids)), 0.0, 0
    for s in range(steps):
        rows = [(r, m) for r, m in enumerate(matchers) if s < len(ids[r])]
        t = time.perf_counter()
        fill_bitmask_rows(mask, rows)
        fill_s += time.perf_counter() - t
        masks += len(rows)
        assert all((int(mask[r, ids[r][s] // 32]) >> (ids[r][s] % 32)) & 1 for r, _ in rows), "a valid token masked out"
        accept_tokens([(m, ids[r][s]) for r, m in rows])
    assert all(m.is_accepting for m in matchers)
    return {"steps": steps, "fill_ms_per_step": round(fill_s / steps * 1e3, 3), "us_per_mask": round(fill_s / masks * 1e6, 1)}


def longest_pause(work) -> tuple:
    """(work's result, its seconds, the longest wait of a thread that wakes every millisecond meanwhile)."""
    gaps, done = [0.0], threading.Event()

    def tick():
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = threading.Thread(target=tick)
    ticker.start()
    start = time.perf_counter()
    try:
        out = work()
    finally:
        done.set()
        ticker.join()
    return out, time.perf_counter() - start, max(gaps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    a = ap.parse_args()
    info, options, spec = tokenizer_info(None), GrammarOptions(), json.dumps(SCHEMA)
    ll, ol = grammar_backend("llguidance", info), grammar_backend("outlines", info)
    regex = to_regex("json_schema", spec, "", options.any_depth)
    ids = [info.tokenizer.encode(instance(i), add_special_tokens=False) for i in range(a.rows)]
    words = (info.vocab_size + 31) // 32
    for path, extra in (("native", {}), ("from_regex", {"regex": regex})) * 2:
        grammar = compile_grammar(ll, "json_schema", spec, options, **extra)
        mask_pass(ll, grammar, ids, words)
        print(json.dumps({"masks": path, "rows": a.rows, "compile_ms": round(grammar.compile_s * 1e3, 1),
                          **mask_pass(ll, grammar, ids, words)}), flush=True)  # fmt: skip
    limits = Limits(time_s=600, max_bytes=1 << 32, memory_bytes=8 << 30)
    for path, work in (("child", lambda: compile_isolated(regex, ol.vocab, limits)), ("in_process", lambda: compile_regex(regex, ol.vocab))):
        grammar, took, pause = longest_pause(work)
        print(json.dumps({"compile": path, "s": round(took, 2), "longest_pause_ms": round(pause * 1e3, 1), "states": len(grammar.states),
                          "MiB": (grammar.tokens.nbytes + grammar.next_dist.nbytes) >> 20}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
