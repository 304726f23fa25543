"""MaskBench conformance and speed of the grammar backends (JSON schemas, real-world corpus).

    python benchmarks/maskbench.py                                   # every backend, whole dev corpus
    python benchmarks/maskbench.py --sample 500 --backends outlines,llguidance --plot benchmarks/results/maskbench.png

Scored as the corpus' authors score it (../shared/data/README.md): an instance is
`json.dumps(data, ensure_ascii=False)`, tokenized with the default model's tokenizer (no
special tokens) and fed token by token through the grammar's mask; it is accepted when
every token is allowed and the grammar may end there. A schema passes when it compiles
and every valid instance is accepted and every invalid one rejected.

Each backend runs in its own worker process, one thread, schemas one after another;
a compile past `--timeout` kills the worker (counted as a compile timeout) and a fresh
one takes the next schema. `--workers N` runs N such lanes side by side (N schemas at a
time; the counts do not depend on N, timings do once N nears the number of cores).
`--shard i/n --raw PART.jsonl` runs every n-th schema from the i-th, and `--merge PART...`
reports on the shards together, as one run over the whole would:

    python benchmarks/maskbench.py --workers 16 --shard 0/4 --raw part0.jsonl   # ... through 3/4
    python benchmarks/maskbench.py --merge part*.jsonl --json all.json --plot all.png JSON whitespace is `[ ]?` between tokens (the instances use
json.dumps' ", " and ": ").

Budget tracking (budget-aware completion): `no_shortest` counts compiled schemas with no
known shortest output (llguidance: its search found none; the compile time includes that
search), and `accept_us` is the time to accept one token of a valid instance in a request
with a token budget (a closing path kept per token on llguidance), beside `accept_us_untracked`
without one.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import random
import re
import sys
import tarfile
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CORPUS = os.path.join(HERE, "..", "..", "shared", "data", "maskbench-dev.tar.gz")


# -- the corpus -----------------------------------------------------------------------------------
def split_of(name: str) -> str:
    base = os.path.basename(name)[: -len(".json")]
    return base.split("---")[0] if "---" in base else base.rsplit("_", 1)[0]


def load_corpus(path: str) -> list:
    """[(name, split, doc)] sorted by name."""
    out = []
    with tarfile.open(path) as tar:
        for member in tar:
            if member.isfile() and member.name.endswith(".json"):
                doc = json.load(tar.extractfile(member))
                out.append((os.path.basename(member.name), split_of(member.name), doc))
    return sorted(out, key=lambda t: t[0])


def sample(corpus: list, n: int, seed: int, only: str = "") -> list:
    if only:
        corpus = [c for c in corpus if re.search(only, c[0])]
    if not n or n >= len(corpus):
        return corpus
    return sorted(random.Random(seed).sample(corpus, n), key=lambda t: t[0])


# -- the worker: one backend, one thread ----------------------------------------------------------
def _worker(backend: str, whitespace: str, jobs, results) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    from radixflow.constrained.grammar import compile_grammar, grammar_backend, tokenizer_info
    from radixflow.constrained.options import GrammarOptions
    from radixflow.errors import GrammarError

    info = tokenizer_info()
    impl = grammar_backend(backend, info)
    options = GrammarOptions(whitespace)
    mask = torch.zeros(1, (info.vocab_size + 31) // 32, dtype=torch.int32)
    words = mask[0].numpy()
    results.put(("ready",))
    while True:
        job = jobs.get()
        if job is None:
            return
        schema_text, tests = job
        start = time.perf_counter()
        try:
            compiled = compile_grammar(impl, "json_schema", schema_text, options)
            m = impl.matcher(compiled)
            m.fill_bitmask(mask, 0)  # compile time is time to the first mask
        except GrammarError as e:
            results.put(("refused", time.perf_counter() - start, _reason(e)))
            continue
        except Exception as e:  # noqa: BLE001 - a backend's own crash is a result too
            results.put(("refused", time.perf_counter() - start, f"internal {type(e).__name__}"))
            continue
        results.put(("compiled", time.perf_counter() - start, compiled.min_tokens))
        outcomes, times, accept_times = [], [], ([], [])
        for data in tests:
            ids = info.tokenizer.encode(json.dumps(data, ensure_ascii=False), add_special_tokens=False)
            m = impl.matcher(compiled)
            ok = True
            for t in ids:
                t0 = time.perf_counter()
                m.fill_bitmask(mask, 0)
                times.append(time.perf_counter() - t0)
                if not (int(words[t >> 5]) >> (t & 31)) & 1:
                    ok = False
                    break
                m.accept_token(t)
            outcomes.append(ok and m.is_accepting)
            if ok and m.is_accepting:
                accept_times[0].extend(_accept_times(impl, compiled, ids, None))
                accept_times[1].extend(_accept_times(impl, compiled, ids, _Budget(1 << 20)))
        results.put(("tested", outcomes, times, accept_times))


class _Budget:
    """A request as a matcher sees it: a token budget and how many tokens it has."""

    def __init__(self, max_new_tokens: int):
        self.sampling = SimpleNamespace(max_new_tokens=max_new_tokens)
        self.segment_len = 0


def _accept_times(impl, compiled, ids: list, req) -> list:
    m = impl.matcher(compiled, req)
    times = []
    for t in ids:
        if req is not None:
            req.segment_len += 1
        t0 = time.perf_counter()
        m.accept_token(t)
        times.append(time.perf_counter() - t0)
    return times


def _reason(e) -> str:
    if e.keyword:
        return f"keyword {e.keyword}"
    text = str(e).split(":", 1)[-1]
    return re.sub(r"[0-9]+|'[^']*'|\"[^\"]*\"", "#", text).strip()[:60]


# -- the parent: one worker per backend, a time limit per compile -----------------------------------
class Runner:
    def __init__(self, backend: str, whitespace: str, timeout: float):
        self.backend, self.whitespace, self.timeout = backend, whitespace, timeout
        self.ctx = mp.get_context("spawn")
        self.proc = None

    def start(self) -> None:
        self.jobs, self.results = self.ctx.Queue(), self.ctx.Queue()
        self.proc = self.ctx.Process(target=_worker, args=(self.backend, self.whitespace, self.jobs, self.results), daemon=True)
        self.proc.start()
        msg = self.results.get(timeout=1800)  # loading the tokenizer and the vocabulary, not timed
        assert msg[0] == "ready", msg

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.join()
            self.proc = None

    def run(self, doc: dict) -> dict:
        if self.proc is None:
            self.start()
        tests = doc.get("tests") or []
        self.jobs.put((json.dumps(doc["schema"]), [t["data"] for t in tests]))
        try:
            msg = self.results.get(timeout=self.timeout)
        except Exception:  # queue.Empty: the compile ran past the limit
            self.stop()
            return {"status": "timeout", "compile_s": self.timeout}
        if msg[0] == "refused":
            return {"status": "refused", "compile_s": msg[1], "reason": msg[2]}
        try:
            _, outcomes, times, accept_times = self.results.get(timeout=max(120.0, self.timeout))
        except Exception:
            self.stop()
            return {"status": "test_timeout", "compile_s": msg[1]}
        valid = [t["valid"] for t in tests]
        return {
            "status": "compiled",
            "compile_s": msg[1],
            "min_tokens": msg[2],
            "invalid_accepted": sum(a and not v for a, v in zip(outcomes, valid)),
            "valid_rejected": sum(v and not a for a, v in zip(outcomes, valid)),
            "mask_s": times,
            "accept_s": accept_times,
        }


@dataclass
class Tally:
    schemas: int = 0
    passing: int = 0
    invalid_accepted: int = 0
    valid_rejected: int = 0
    refused: int = 0
    timeouts: int = 0
    compile_s: list = field(default_factory=list)
    mask_s: list = field(default_factory=list)
    reasons: collections.Counter = field(default_factory=collections.Counter)
    leaky: list = field(default_factory=list)  # schemas with an invalid instance accepted
    shortest: list = field(default_factory=list)  # per compiled schema: its shortest output in tokens
    no_shortest: int = 0  # compiled, but no shortest output known (llguidance: its search found none)
    accept_s: tuple = field(default_factory=lambda: ([], []))  # per token: (untracked, with a budget)

    def add(self, name: str, r: dict) -> None:
        self.schemas += 1
        self.compile_s.append(r["compile_s"])
        if r["status"] == "compiled":
            self.passing += r["invalid_accepted"] == 0 and r["valid_rejected"] == 0
            self.invalid_accepted += r["invalid_accepted"]
            if r["invalid_accepted"]:
                self.leaky.append(name)
            self.valid_rejected += r["valid_rejected"]
            self.mask_s.extend(r["mask_s"])
            self.accept_s[0].extend(r["accept_s"][0])
            self.accept_s[1].extend(r["accept_s"][1])
            if r["min_tokens"] is None:
                self.no_shortest += 1
            else:
                self.shortest.append(r["min_tokens"])
        elif r["status"] == "refused":
            self.refused += 1
            self.reasons[r["reason"]] += 1
        else:
            self.timeouts += 1
            self.reasons[r["status"]] += 1

    def summary(self) -> dict:
        pct = lambda xs, q: float(np.percentile(xs, q)) if xs else float("nan")  # noqa: E731
        return {
            "schemas": self.schemas,
            "passing": self.passing,
            "passing_pct": round(100.0 * self.passing / max(self.schemas, 1), 1),
            "invalid_accepted": self.invalid_accepted,
            "valid_rejected": self.valid_rejected,
            "refused": self.refused,
            "compile_timeouts": self.timeouts,
            "compile_ms_p50": round(1e3 * pct(self.compile_s, 50), 2),
            "compile_ms_p99": round(1e3 * pct(self.compile_s, 99), 1),
            "mask_us_p50": round(1e6 * pct(self.mask_s, 50), 1),
            "mask_us_p99": round(1e6 * pct(self.mask_s, 99), 1),
            "masks": len(self.mask_s),
            "no_shortest": self.no_shortest,
            "shortest_tokens_p50": pct(self.shortest, 50),
            "accept_us_untracked_p50": round(1e6 * pct(self.accept_s[0], 50), 1),
            "accept_us_untracked_p99": round(1e6 * pct(self.accept_s[0], 99), 1),
            "accept_us_p50": round(1e6 * pct(self.accept_s[1], 50), 1),
            "accept_us_p99": round(1e6 * pct(self.accept_s[1], 99), 1),
        }


def bench(corpus: list, backends: list, whitespace: str, timeout: float, workers: int = 1, log_every: int = 200) -> list:
    """Per schema, in corpus order: {backend: result}. `workers` lanes run side by side, each
    with its own worker process per backend (the backends take turns per schema within a
    lane, so they see the same load); each schema's result does not depend on the lane."""
    results: list = [None] * len(corpus)
    order = iter(range(len(corpus)))
    lock = threading.Lock()
    done = [0]

    def lane() -> None:
        runners = {b: Runner(b, whitespace, timeout) for b in backends}
        try:
            while True:
                with lock:
                    i = next(order, None)
                if i is None:
                    return
                results[i] = {b: runner.run(corpus[i][2]) for b, runner in runners.items()}
                with lock:
                    done[0] += 1
                    if log_every and done[0] % log_every == 0:
                        print(f"[{done[0]}/{len(corpus)}]", file=sys.stderr, flush=True)
        finally:
            for runner in runners.values():
                runner.stop()

    threads = [threading.Thread(target=lane, daemon=True) for _ in range(max(1, workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is not None for r in results), "a lane stopped early"
    return results


def tally(corpus: list, results: list) -> dict:
    """{backend: {split or "total": Tally}}, adding schemas in corpus order."""
    tallies: dict = collections.defaultdict(lambda: collections.defaultdict(Tally))
    for (name, split, _), per_backend in zip(corpus, results):
        for b, r in per_backend.items():
            tallies[b][split].add(name, r)
            tallies[b]["total"].add(name, r)
    return tallies


def write_raw(path: str, corpus: list, results: list) -> None:
    """Per-schema results (one shard's), for --merge."""
    with open(path, "w") as f:
        for (name, split, _), per_backend in zip(corpus, results):
            f.write(json.dumps({"name": name, "split": split, "results": per_backend}) + "\n")


def read_raw(paths: list) -> tuple:
    """The shards' results merged back into corpus (name) order: (corpus without docs, results)."""
    rows = []
    for path in paths:
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    rows.sort(key=lambda r: r["name"])
    names = [r["name"] for r in rows]
    assert len(set(names)) == len(names), "a schema is in two shards"
    return [(r["name"], r["split"], None) for r in rows], [r["results"] for r in rows]


def report(tallies: dict) -> dict:
    out = {}
    for b, splits in tallies.items():
        out[b] = {s: t.summary() for s, t in sorted(splits.items())}
        out[b]["total"]["refusal_reasons"] = dict(splits["total"].reasons.most_common(25))
        out[b]["total"]["invalid_accepted_schemas"] = splits["total"].leaky
    return out


def print_table(summary: dict) -> None:
    cols = ("schemas", "passing", "passing_pct", "invalid_accepted", "valid_rejected", "refused", "compile_timeouts",
            "compile_ms_p50", "compile_ms_p99", "mask_us_p50", "mask_us_p99", "no_shortest", "accept_us_untracked_p99",
            "accept_us_p50", "accept_us_p99")
    print("| backend | split | " + " | ".join(cols) + " |")
    print("|" + " --- |" * (len(cols) + 2))
    for b, splits in summary.items():
        for s, row in splits.items():
            print(f"| {b} | {s} | " + " | ".join(str(row[c]) for c in cols) + " |")
    for b, splits in summary.items():
        print(f"\n{b} refusal reasons: {json.dumps(splits['total'].get('refusal_reasons', {}))}")
        print(f"{b} schemas with an invalid instance accepted: {splits['total'].get('invalid_accepted_schemas')}")


def plot(summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = sorted({s for rows in summary.values() for s in rows if s != "total"}) + ["total"]
    fig, ax = plt.subplots(figsize=(max(8, 0.7 * len(splits) * len(summary)), 4.5))
    width = 0.8 / len(summary)
    for k, (b, rows) in enumerate(summary.items()):
        vals = [rows.get(s, {}).get("passing_pct", 0) for s in splits]
        ax.bar(np.arange(len(splits)) + k * width, vals, width, label=b)
    ax.set_xticks(np.arange(len(splits)) + 0.4 - width / 2, splits, rotation=45, ha="right")
    ax.set_ylabel("schemas passing (%)")
    ax.set_ylim(0, 100)
    ax.set_title("MaskBench dev corpus: passing share per split and grammar backend")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default=DEFAULT_CORPUS)
    p.add_argument("--backends", default="outlines,llguidance")
    p.add_argument("--sample", type=int, default=0, help="schemas drawn with --seed (0 = all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default="", help="regex on file names (e.g. a split)")
    p.add_argument("--timeout", type=float, default=10.0, help="compile time limit per schema (s)")
    p.add_argument("--whitespace", default="[ ]?")
    p.add_argument("--json", default=None, help="write the summary here")
    p.add_argument("--plot", default=None, help="write a PNG of the passing share here")
    p.add_argument("--workers", type=int, default=1, help="schemas run side by side (one worker process per backend each)")
    p.add_argument("--shard", default=None, help="i/n: run only schemas i, i+n, i+2n, ... of the (sampled) corpus")
    p.add_argument("--raw", default=None, help="write per-schema results here (JSON lines), to --merge shards later")
    p.add_argument("--merge", nargs="+", default=None, help="report on shards' --raw files instead of running")
    args = p.parse_args()
    start = time.time()
    if args.merge:
        corpus, results = read_raw(args.merge)
    else:
        corpus = sample(load_corpus(args.corpus), args.sample, args.seed, args.only)
        if args.shard:
            i, n = map(int, args.shard.split("/"))
            corpus = corpus[i::n]
        results = bench(corpus, args.backends.split(","), args.whitespace, args.timeout, args.workers)
        if args.raw:
            write_raw(args.raw, corpus, results)
    summary = report(tally(corpus, results))
    print(f"{len(corpus)} schemas, {time.time() - start:.0f} s", file=sys.stderr)
    print_table(summary)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    if args.plot:
        plot(summary, args.plot)


if __name__ == "__main__":
    main()
