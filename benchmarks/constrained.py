"""Constrained decoding on CPU: compile time, cache hit rate, mask overhead, constrained vs
unconstrained decode throughput, and JSON extraction with jump-forward on vs off.

    .venv/bin/python benchmarks/constrained.py            # prints a markdown block
    .venv/bin/python benchmarks/constrained.py --append   # and appends it to BENCHMARKS.md
    .venv/bin/python benchmarks/constrained.py --only extraction --docs 8 --batches 1,8 --repeat 1

Timings on a shared machine are noisy: each throughput figure is the best of --repeat runs,
alternating the two settings.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from constrained_corpus import SCHEMAS  # noqa: E402

# JSON extraction workload, in the style of SGLang's jump-forward benchmark
# (benchmark/json_jump_forward: character / city records with descriptive keys, enums and
# a nested object): what a user extracting records from text sends. Pull a person's record
# out of a short biography. Keys are the descriptive snake_case names a Pydantic model would
# have; closed sets are enums; contact details are a nested object; free-text strings have a
# maxLength (the e-mail address, a `format`, has none: greedy decoding with jump-forward off
# sometimes runs on there until max_new_tokens, which the report shows as "at max_new_tokens").
# Jump-forward can skip the keys, the punctuation between fields and the rest of an enum
# value once its first token decides it; names, cities, job titles, numbers and e-mail
# addresses must be sampled. The two settings do not give the same text: without
# jump-forward the model, not knowing the keys, spells them in short tokens (`f` `ul` `l`
# `_` `name`) where jump-forward appends the tokenizer's own split (`full` `_` `name`), so
# "off" also emits more tokens per document.
EXTRACT_SCHEMA = {
    "type": "object",
    "properties": {
        "full_name": {"type": "string", "maxLength": 40},
        "year_of_birth": {"type": "integer", "minimum": 1900, "maximum": 2025},
        "city_of_residence": {"type": "string", "maxLength": 30},
        "current_job_title": {"type": "string", "maxLength": 40},
        "employment_status": {"enum": ["employed", "self-employed", "unemployed", "retired", "student"]},
        "highest_education_level": {"enum": ["secondary school", "bachelor's degree", "master's degree", "doctorate"]},
        "spoken_languages": {
            "type": "array",
            "items": {"enum": ["English", "French", "German", "Spanish", "Italian", "Japanese", "Mandarin", "Portuguese"]},
            "maxItems": 4,
        },
        "contact_details": {
            "type": "object",
            "properties": {
                "email_address": {"type": "string", "format": "email"},
                "preferred_contact_method": {"enum": ["email", "phone", "post"]},
            },
            "required": ["email_address", "preferred_contact_method"],
        },
        "has_driving_licence": {"type": "boolean"},
    },
    "required": [
        "full_name", "year_of_birth", "city_of_residence", "current_job_title", "employment_status",
        "highest_education_level", "spoken_languages", "contact_details", "has_driving_licence",
    ],
}  # fmt: skip
# (name, born, city, job, status, education, languages, email, contact, drives)
PEOPLE = [
    ("Maria Lopez", 1990, "Madrid", "architect", "employed", "master's degree", "Spanish and English", "maria.lopez@example.es", "email", True),
    ("Kenji Tanaka", 1973, "Osaka", "chef", "self-employed", "secondary school", "Japanese", "kenji@tanaka-kitchen.jp", "phone", False),
    ("Anna Schmidt", 1996, "Berlin", "nurse", "employed", "bachelor's degree", "German and French", "anna.schmidt@example.de", "email", True),
    ("Tom Baker", 1979, "Leeds", "history teacher", "employed", "master's degree", "English", "t.baker@leeds-school.uk", "post", True),
    ("Lucia Rossi", 1958, "Turin", "retired engineer", "retired", "doctorate", "Italian, English and German", "lucia.rossi@example.it", "phone", False),
    ("Wei Zhang", 2003, "Shanghai", "computer science student", "student", "secondary school", "Mandarin and English", "wei.zhang@uni-mail.cn", "email", False),
    ("Pierre Dubois", 1985, "Lyon", "freelance photographer", "self-employed", "bachelor's degree", "French and Spanish", "pierre@dubois-photo.fr", "email", True),
    ("Ana Costa", 1992, "Porto", "software developer", "unemployed", "master's degree", "Portuguese, English and Spanish", "ana.costa@example.pt", "email", True),
    ("James O'Neill", 1968, "Dublin", "bus driver", "employed", "secondary school", "English", "jim.oneill@example.ie", "phone", True),
    ("Sofia Petrova", 1988, "Munich", "data analyst", "employed", "master's degree", "German, English and French", "s.petrova@example.de", "email", False),
    ("Hiroshi Sato", 1950, "Kyoto", "retired pharmacist", "retired", "bachelor's degree", "Japanese and English", "h.sato@example.jp", "post", True),
    ("Isabel Fernandes", 2001, "Lisbon", "medical student", "student", "bachelor's degree", "Portuguese and French", "isabel.f@uni-lisboa.pt", "email", False),
    ("Marco Bianchi", 1982, "Milan", "carpenter", "self-employed", "secondary school", "Italian", "marco@bianchi-legno.it", "phone", True),
    ("Emma Wilson", 1975, "Toronto", "marketing manager", "unemployed", "bachelor's degree", "English and French", "emma.wilson@example.ca", "email", True),
    ("Li Na", 1994, "Beijing", "research chemist", "employed", "doctorate", "Mandarin, English and German", "li.na@lab-example.cn", "email", False),
    ("Carlos Mendes", 1960, "Seville", "retired pilot", "retired", "bachelor's degree", "Spanish, English and Portuguese", "c.mendes@example.es", "post", True),
]


def extraction_prompt(person: tuple) -> str:
    name, born, city, job, status, education, langs, email, contact, drives = person
    a_job = ("an " if job[0] in "aeiou" else "a ") + job
    work = {"employed": f"work as {a_job}", "self-employed": f"run their own business as {a_job}",
            "unemployed": f"are looking for work as {a_job}", "retired": f"are {a_job}", "student": f"are {a_job}"}[status]  # fmt: skip
    doc = (
        f"{name} was born in {born} and lives in {city}, where they {work}. Their highest qualification is "
        f"{'a secondary school diploma' if education == 'secondary school' else 'a ' + education}. "
        f"They speak {langs}. {'They hold' if drives else 'They do not have'} a driving licence. "
        f"You can reach them at {email}; they prefer to be contacted by {contact}."
    )
    return f"Extract the person's details from the text as JSON.\nText: {doc}\nJSON:"


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
    from radixflow.runtime.scheduling.sampler import apply_grammar_masks

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
        apply_grammar_masks(work, reqs)  # what a step does (its own fill, then the apply)
        t2 = time.perf_counter()
        fill.append((t1 - t0) / batch * 1e6)
        total.append((t2 - t1) / batch * 1e6)
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


class _PassLog:
    """Wraps runner.forward: counts passes by mode (decode / extend) and their time."""

    def __init__(self, runner):
        self.runner, self.inner = runner, runner.forward
        self.count = {"decode": 0, "extend": 0}
        self.seconds = {"decode": 0.0, "extend": 0.0}

    def __enter__(self):
        def forward(fb):
            mode = "decode" if fb.mode.name == "DECODE" else "extend"
            t = time.perf_counter()
            out = self.inner(fb)
            self.seconds[mode] += time.perf_counter() - t
            self.count[mode] += 1
            return out

        self.runner.forward = forward
        return self

    def __exit__(self, *exc):
        del self.runner.forward


def bench_extraction(engine, batch: int, total: int, repeat: int) -> dict:
    """`total` documents, `batch` at a time, greedy, jump-forward off vs on (best of
    `repeat` runs each, alternating). Every output must validate against the schema."""
    from jsonschema import Draft202012Validator

    checker = Draft202012Validator(EXTRACT_SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
    prompts = [extraction_prompt(p) for p in (PEOPLE * total)[:total]]
    params = {"json_schema": EXTRACT_SCHEMA, "max_new_tokens": 256, "temperature": 0}
    sched = engine.scheduler
    backend = sched._grammars()
    backend.compile("json_schema", json.dumps(EXTRACT_SCHEMA))  # compile outside the timings
    engine.generate(prompts[:batch], {"max_new_tokens": 4, "temperature": 0})  # warm this batch shape
    runs = {True: [], False: []}
    for _ in range(repeat):
        for on in (False, True):
            sched.jump_forward, backend.jump_enabled = (backend.jump_forward if on else None), on
            with _PassLog(engine.runner) as log:
                dt, outs = _generate_all(engine, prompts, params, batch)
            texts = [o["text"] for o in outs]
            for text in texts:
                errors = [e.message for e in checker.iter_errors(json.loads(text))]
                assert not errors, (text, errors)
            runs[on].append({
                "s": dt, "passes": sum(log.count.values()), "decode_passes": log.count["decode"],
                "extend_passes": log.count["extend"], "decode_s": log.seconds["decode"], "extend_s": log.seconds["extend"],
                "tokens": sum(o["meta_info"]["completion_tokens"] for o in outs),
                "jumped": sum(o["meta_info"].get("jump_forward_tokens", 0) for o in outs), "texts": texts,
                "longest": max(o["meta_info"]["completion_tokens"] for o in outs),
                "at_limit": sum(o["meta_info"]["completion_tokens"] >= params["max_new_tokens"] for o in outs),
            })  # fmt: skip
    sched.jump_forward, backend.jump_enabled = backend.jump_forward, True
    off, on = min(runs[False], key=lambda r: r["s"]), min(runs[True], key=lambda r: r["s"])
    same = sum(a == b for a, b in zip(off.pop("texts"), on.pop("texts")))
    for r in runs[False] + runs[True]:
        r.pop("texts", None)
    return {"batch": batch, "total": total, "off": off, "on": on, "speedup": off["s"] / on["s"],
            "jumped_frac": on["jumped"] / max(on["tokens"], 1), "same_text": same}  # fmt: skip


# -- report ---------------------------------------------------------------------------------------------------
def extraction_lines(ext: list) -> list:
    lines = []
    for e in ext:
        off, on = e["off"], e["on"]
        lines.append(
            f"- JSON extraction, {e['total']} documents, batch {e['batch']} (9-field person schema with enums and a nested "
            f"object, greedy): jump-forward off {off['s']:.2f} s ({off['passes']} forward passes: {off['decode_passes']} decode "
            f"{off['decode_s']:.2f} s + {off['extend_passes']} extend {off['extend_s']:.2f} s), on {on['s']:.2f} s "
            f"({on['passes']} passes: {on['decode_passes']} decode {on['decode_s']:.2f} s + {on['extend_passes']} extend "
            f"{on['extend_s']:.2f} s); output tokens off {off['tokens']} (longest {off['longest']}, {off['at_limit']} at "
            f"max_new_tokens), on {on['tokens']} (longest {on['longest']}, {on['at_limit']} at the limit), {on['jumped']} of "
            f"them jumped ({e['jumped_frac']:.0%}); {e['same_text']}/{e['total']} outputs identical; "
            f"speed-up {e['speedup']:.2f}x (target >= 1.5x)."
        )
    return lines


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
    lines += extraction_lines(ext)
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--append", action="store_true", help="append the figures to BENCHMARKS.md")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--mask-steps", type=int, default=300)
    ap.add_argument("--only", choices=("extraction",), help="run only this section")
    ap.add_argument("--docs", type=int, default=len(PEOPLE), help="documents in the extraction section")
    ap.add_argument("--batches", default="1,16", help="extraction batch sizes, comma-separated")
    args = ap.parse_args()
    torch.set_num_threads(2)
    from radixflow import Engine

    engine = Engine()
    engine.generate("warm up", {"max_new_tokens": 2, "regex": "[a-z]+"})
    batches = [int(b) for b in args.batches.split(",")]
    if args.only == "extraction":
        ext = []
        for b in batches:
            ext.append(bench_extraction(engine, b, args.docs, args.repeat))
            print("extraction", ext[-1], flush=True)
        print("\n".join(extraction_lines(ext)))
        return
    c = bench_compile(engine)
    print("compile", c, flush=True)
    masks = [bench_masks(engine, b, args.mask_steps) for b in (1, 32)]
    print("masks", masks, flush=True)
    dec = bench_decode(engine, 16, 48, args.repeat)
    print("decode", dec, flush=True)
    ext = [bench_extraction(engine, b, args.docs, args.repeat) for b in batches]
    print("extraction", ext, flush=True)
    text = report(c, masks, dec, ext, "python benchmarks/constrained.py" + (" --append" if args.append else ""))
    print(text)
    if args.append:
        with open(os.path.join(os.path.dirname(__file__), "..", "BENCHMARKS.md"), "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
