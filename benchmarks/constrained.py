"""Constrained decoding on CPU: compile time, cache hit rate, mask overhead, constrained vs
unconstrained decode throughput, and JSON extraction with jump-forward on vs off.

    .venv/bin/python benchmarks/constrained.py            # prints a markdown block
    .venv/bin/python benchmarks/constrained.py --append   # and appends it to BENCHMARKS.md

Timings on a shared machine are noisy: each throughput figure is the best of --repeat runs,
alternating the two settings.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from constrained_corpus import SCHEMAS  # noqa: E402

EXTRACT_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 30},
        "occupation": {"type": "string", "maxLength": 30},
        "email": {"type": "string", "format": "email"},
        "is_married": {"type": "boolean"},
        "children": {"type": "integer", "minimum": 0, "maximum": 20},
        "languages": {"type": "array", "items": {"enum": ["English", "French", "German", "Spanish", "Japanese"]}, "maxItems": 3},
    },
    "required": ["name", "age", "city", "occupation", "email", "is_married", "children", "languages"],
}
PEOPLE = [
    ("Maria Lopez", 34, "Madrid", "architect", "Spanish and English"),
    ("Kenji Tanaka", 51, "Osaka", "chef", "Japanese"),
    ("Anna Schmidt", 28, "Berlin", "nurse", "German and French"),
    ("Tom Baker", 45, "Leeds", "teacher", "English"),
]


def pct(values: list, q: float) -> float:
    return float(np.percentile(np.array(values), q))


# -- compile time and cache ---------------------------------------------------------------------------
def bench_compile(engine) -> dict:
    from radixflow.constrained.backend import GrammarBackend

    backend = GrammarBackend(engine.tokenizer, engine.runner.vocab_size, engine.eos_ids)
    t = time.perf_counter()
    backend.vocab  # noqa: B018 - built once per tokenizer
    vocab_s = time.perf_counter() - t
    times = []
    for schema in SCHEMAS:
        times.append(backend.compile("json_schema", json.dumps(schema)).compile_s)
    rng = np.random.default_rng(0)
    ranks = np.minimum(rng.zipf(1.3, size=300), len(SCHEMAS)) - 1  # a skewed mix of the schemas
    backend.cache.clear()  # replay a request mix against a cold cache
    hits0, miss0 = backend.cache.hits, backend.cache.misses
    for r in ranks:
        backend.compile("json_schema", json.dumps(SCHEMAS[int(r)]))
    hits, misses = backend.cache.hits - hits0, backend.cache.misses - miss0
    return {"vocab_s": vocab_s, "p50_ms": pct(times, 50) * 1e3, "p99_ms": pct(times, 99) * 1e3,
            "max_ms": max(times) * 1e3, "n": len(times), "hit_rate": hits / (hits + misses), "requests": len(ranks)}  # fmt: skip


# -- mask overhead ------------------------------------------------------------------------------------------
class _Req:
    def __init__(self, grammar):
        from radixflow.constrained.matcher import GrammarMatcher

        self.sampling = type("S", (), {"max_new_tokens": 1 << 20})()
        self.output_ids: list = []
        self.segment_start = 0
        self.grammar = GrammarMatcher(grammar, self)

    @property
    def segment_len(self) -> int:
        return len(self.output_ids)


def _advance_randomly(reqs, rng, vocab_size: int) -> None:
    """Move every matcher on by one allowed token (restart when it ends)."""
    words = (vocab_size + 31) // 32
    mask = torch.zeros(1, words, dtype=torch.int32)
    for r in reqs:
        if r.grammar.is_terminated():
            r.__init__(r.grammar.grammar)
            continue
        r.grammar.fill_bitmask(mask, 0)
        ids = np.nonzero(np.unpackbits(mask.numpy().view(np.uint8), bitorder="little")[:vocab_size])[0]
        ids = ids[ids != 2]
        tok = int(rng.choice(ids))
        r.output_ids.append(tok)
        r.grammar.accept_token(tok)


def bench_masks(engine, batch: int, steps: int) -> dict:
    from radixflow.kernels.bitmask import apply_token_bitmask

    backend = engine.scheduler._grammars()
    vocab = engine.runner.vocab_size
    grammars = [backend.compile("json_schema", json.dumps(SCHEMAS[i % len(SCHEMAS)])) for i in range(batch)]
    reqs = [_Req(g) for g in grammars]
    rng = np.random.default_rng(batch)
    logits = torch.randn(batch, vocab)
    bitmask = torch.full((batch, (vocab + 31) // 32), -1, dtype=torch.int32)
    for _ in range(steps):  # warm the per-state mask caches, as a running server has them
        _advance_randomly(reqs, rng, vocab)
        for i, r in enumerate(reqs):
            r.grammar.fill_bitmask(bitmask, i)
    fill, total = [], []
    for _ in range(steps):
        _advance_randomly(reqs, rng, vocab)
        work = logits.clone()
        t0 = time.perf_counter()
        for i, r in enumerate(reqs):
            r.grammar.fill_bitmask(bitmask, i)
        t1 = time.perf_counter()
        apply_token_bitmask(work, bitmask)
        t2 = time.perf_counter()
        fill.append((t1 - t0) / batch * 1e6)
        total.append((t2 - t0) / batch * 1e6)
    return {"batch": batch, "fill_p50": pct(fill, 50), "fill_p99": pct(fill, 99),
            "total_p50": pct(total, 50), "total_p99": pct(total, 99)}  # fmt: skip


# -- throughput ------------------------------------------------------------------------------------------------
def _timed(engine, prompts, params) -> tuple[float, list]:
    t = time.perf_counter()
    outs = engine.generate(prompts, params)
    return time.perf_counter() - t, outs


def bench_decode(engine, batch: int, tokens: int, repeat: int) -> dict:
    prompts = [f"Write a short story about a {w}." for w in ("cat", "ship", "tree", "robot")] * (batch // 4)
    base = {"max_new_tokens": tokens, "min_new_tokens": tokens, "temperature": 0}
    plain, constrained = [], []
    free_text = r"[A-Za-z0-9 ,.;:'!?\n-]+"  # no forced text, never ends early: every step masked
    for _ in range(repeat):
        plain.append(_timed(engine, prompts, base)[0])
        constrained.append(_timed(engine, prompts, {**base, "regex": free_text})[0])
    n = batch * tokens
    return {"batch": batch, "tokens": tokens, "plain_tps": n / min(plain), "constrained_tps": n / min(constrained)}


def _generate_all(engine, prompts: list, params: dict, batch: int) -> tuple[float, list]:
    """`batch` requests at a time (1 = one after another: latency-bound)."""
    t = time.perf_counter()
    outs = []
    for i in range(0, len(prompts), batch):
        outs += engine.generate(prompts[i : i + batch], params)
    return time.perf_counter() - t, outs


def bench_extraction(engine, batch: int, total: int, repeat: int) -> dict:
    prompts = [
        f"{name} is {age} years old and lives in {city}, where they work as a {job}. They speak {langs}. "
        f"Extract the person's details as JSON.\nJSON:"
        for name, age, city, job, langs in (PEOPLE * total)[:total]
    ]
    params = {"json_schema": EXTRACT_SCHEMA, "max_new_tokens": 160, "temperature": 0}
    sched = engine.scheduler
    backend = sched._grammars()
    times = {True: [], False: []}
    stats = {}
    for _ in range(repeat):
        for on in (False, True):
            sched.jump_forward, backend.jump_enabled = (backend.jump_forward if on else None), on
            calls = {"n": 0}
            inner = engine.runner.forward
            engine.runner.forward = lambda fb, inner=inner: (calls.__setitem__("n", calls["n"] + 1), inner(fb))[1]
            dt, outs = _generate_all(engine, prompts, params, batch)
            del engine.runner.forward
            times[on].append(dt)
            for o in outs:
                json.loads(o["text"])
            stats[on] = {"passes": calls["n"], "tokens": sum(o["meta_info"]["completion_tokens"] for o in outs),
                         "jumped": sum(o["meta_info"].get("jump_forward_tokens", 0) for o in outs)}  # fmt: skip
    sched.jump_forward, backend.jump_enabled = backend.jump_forward, True
    off, on = min(times[False]), min(times[True])
    return {"batch": batch, "total": total, "off_s": off, "on_s": on, "speedup": off / on, "off": stats[False], "on": stats[True]}


# -- report ---------------------------------------------------------------------------------------------------
def report(c: dict, masks: list, dec: dict, ext: list, command: str) -> str:
    lines = [
        f"## Constrained decoding ({datetime.date.today().isoformat()}, 2-core CPU, default model SmolLM2-135M)",
        "",
        f"Command: `{command}`",
        "",
        f"- Grammar compile (JSON schema -> regex -> token FSM, {c['n']} schemas of the test corpus): "
        f"p50 {c['p50_ms']:.0f} ms, p99 {c['p99_ms']:.0f} ms, max {c['max_ms']:.0f} ms; vocabulary built once in {c['vocab_s']:.2f} s.",
        f"- Grammar cache hit rate: {c['hit_rate']:.1%} over {c['requests']} requests drawn (Zipf 1.3) from those schemas.",
    ]
    for m in masks:
        lines.append(
            f"- Mask overhead, batch {m['batch']}: fill {m['fill_p50']:.1f} µs p50 / {m['fill_p99']:.1f} µs p99 per request per step; "
            f"fill + apply {m['total_p50']:.1f} µs p50 / {m['total_p99']:.1f} µs p99 per request per step (target <= 50 µs p50)."
        )
    lines += [
        f"- Decode throughput, batch {dec['batch']}, {dec['tokens']} tokens each: unconstrained {dec['plain_tps']:.1f} tok/s, "
        f"regex-constrained (every step masked) {dec['constrained_tps']:.1f} tok/s ({dec['constrained_tps'] / dec['plain_tps']:.2f}x).",
    ]
    for e in ext:
        lines.append(
            f"- JSON extraction, {e['total']} documents, batch {e['batch']} (8-field schema, greedy): jump-forward off {e['off_s']:.2f} s "
            f"({e['off']['passes']} forward passes), on {e['on_s']:.2f} s ({e['on']['passes']} passes, "
            f"{e['on']['jumped']} of {e['on']['tokens']} output tokens jumped): speed-up {e['speedup']:.2f}x (target >= 1.5x)."
        )
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--append", action="store_true", help="append the figures to BENCHMARKS.md")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--mask-steps", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(2)
    from radixflow import Engine

    engine = Engine()
    engine.generate("warm up", {"max_new_tokens": 2, "regex": "[a-z]+"})
    c = bench_compile(engine)
    print("compile", c, flush=True)
    masks = [bench_masks(engine, b, args.mask_steps) for b in (1, 32)]
    print("masks", masks, flush=True)
    dec = bench_decode(engine, 16, 48, args.repeat)
    print("decode", dec, flush=True)
    ext = [bench_extraction(engine, 1, 4, args.repeat), bench_extraction(engine, 16, 16, args.repeat)]
    print("extraction", ext, flush=True)
    text = report(c, masks, dec, ext, "python benchmarks/constrained.py" + (" --append" if args.append else ""))
    print(text)
    if args.append:
        with open(os.path.join(os.path.dirname(__file__), "..", "BENCHMARKS.md"), "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
