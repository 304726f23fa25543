"""Tool calls on the BFCL function schemas of MaskBench: do the returned calls parse and validate?

Each BFCL_* file of ../shared/data/maskbench-dev.tar.gz holds one task's functions (a schema
`{"properties": {NAME: PARAMETERS}}`, or an anyOf of several) and a ground-truth call. Each task
becomes a chat request with those functions as `tools` and `tool_choice: "required"`; the user
message asks for the ground-truth call in words (the corpus keeps no BFCL question). Every
returned call is checked: its arguments parse as JSON and validate (jsonschema) against its
function's parameters. The same messages are then sent without tools, for the throughput ratio.

    python benchmarks/tool_calls_bfcl.py --sample 40                 # starts a server on the default model
    python benchmarks/tool_calls_bfcl.py --base-url http://127.0.0.1:30000 --sample 0   # all 1,043
    python benchmarks/tool_calls_bfcl.py --sample 0 --chunk 32 --stop-at 20:15   # as many as fit, in order
    python benchmarks/tool_calls_bfcl.py --grammar-only --sample 0   # no model: grammars vs ground truth

The tasks run in a fixed-seed order stratified by split (every prefix holds each BFCL split
in proportion), `--chunk` at a time, each chunk through all four phases
(temperature 0 and 1, with and without tools) before the next; the table is printed after
every chunk. With `--stop-at HH:MM` (UTC) no chunk starts after that time, so a run that
cannot finish reports a fixed-seed prefix of whole chunks, every task of it counted. One
server serves the whole run (default backend: llguidance); `--server-per-chunk` starts a
fresh one per chunk.

--grammar-only builds each task's call grammar (the server's code path) and checks that every
ground-truth call, written in the generic format, matches it (Python's re, not the token FSM).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import json
import os
import random
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field

import jsonschema
import openai

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from serving_helpers import start_server  # noqa: E402

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "maskbench-dev.tar.gz")


@dataclass
class Task:
    name: str
    tools: list
    messages: list
    schemas: dict  # function name -> parameters


@dataclass
class Tally:
    requests: int = 0
    refused: list = field(default_factory=list)  # (task, 400 message)
    errors: list = field(default_factory=list)  # (task, any other failure)
    calls: int = 0
    parsed: int = 0
    valid: int = 0
    without_calls: int = 0  # answered without any call (cut by max_tokens)
    closed_by_length: int = 0  # finish "length": max_tokens closed the calls early (grammar_closed)
    out_tokens: int = 0
    seconds: float = 0.0

    def add(self, other: "Tally") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


def load_tasks(corpus: str, sample: int, seed: int, docs: dict = None) -> list:
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(corpus) as tar:
            members = [m for m in tar.getmembers() if os.path.basename(m.name).startswith("BFCL_")]
            tar.extractall(tmp, members=members, filter="data")
        files = stratified_order(sorted(glob.glob(os.path.join(tmp, "**", "BFCL_*.json"), recursive=True)), seed)
        if sample:
            files = files[:sample]
        tasks = []
        for f in files:
            doc = json.load(open(f))
            tasks.append(_task(os.path.basename(f)[:-5], doc))
            if docs is not None:
                docs[tasks[-1].name] = doc
        return tasks


def stratified_order(files: list, seed: int) -> list:
    """Each split shuffled with `seed`, then interleaved in proportion to its size: every
    prefix of the order is a fixed-seed sample stratified by split."""
    splits: dict = {}
    for f in files:
        splits.setdefault(os.path.basename(f).rsplit("_", 1)[0], []).append(f)  # BFCL_parallel_12.json
    keyed = []
    for name, members in sorted(splits.items()):
        random.Random(f"{seed}:{name}").shuffle(members)
        keyed += [((i + 0.5) / len(members), name, f) for i, f in enumerate(members)]
    return [f for _, _, f in sorted(keyed)]


def _task(name: str, doc: dict) -> Task:
    alternatives = doc["schema"].get("anyOf", [doc["schema"]])
    schemas = {k: v for alt in alternatives for k, v in alt["properties"].items()}
    tools = [{"type": "function", "function": {"name": k, "parameters": v}} for k, v in schemas.items()]
    truth = next((t["data"] for t in doc.get("tests", []) if t["valid"]), None)
    if truth:
        fn, args = next(iter(truth.items()))
        ask = f"Please call {fn} with {json.dumps(args)}."
    else:
        ask = f"Please call {next(iter(schemas))}."
    return Task(name, tools, [{"role": "user", "content": ask}], schemas)


def run(client, tasks: list, tools: bool, temperature: float, max_tokens: int, concurrency: int) -> Tally:
    tally = Tally()
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        for task, result in zip(tasks, pool.map(lambda t: _one(client, t, tools, temperature, max_tokens), tasks)):
            _count(tally, task, result)
    tally.seconds = time.perf_counter() - start
    return tally


def _one(client, task: Task, tools: bool, temperature: float, max_tokens: int):
    extra = {"tools": task.tools, "tool_choice": "required"} if tools else {}
    try:
        return client.chat.completions.create(model="default", messages=task.messages, temperature=temperature,
                                              max_tokens=max_tokens, seed=0, **extra)  # fmt: skip
    except openai.APIError as e:  # a 400 is counted as refused, anything else as an error
        return e


def _count(tally: Tally, task: Task, r) -> None:
    tally.requests += 1
    if isinstance(r, openai.BadRequestError):
        tally.refused.append((task.name, r.response.json()["error"]["message"]))
        return
    if isinstance(r, openai.APIError):
        tally.errors.append((task.name, f"{type(r).__name__}: {r}"))
        return
    tally.out_tokens += r.usage.completion_tokens
    calls = r.choices[0].message.tool_calls or []
    tally.without_calls += not calls
    tally.closed_by_length += r.choices[0].finish_reason == "length"
    for c in calls:
        tally.calls += 1
        try:
            args = json.loads(c.function.arguments)
        except json.JSONDecodeError:
            continue
        tally.parsed += 1
        try:
            jsonschema.validate(args, task.schemas[c.function.name])
            tally.valid += 1
        except (jsonschema.ValidationError, KeyError):
            print(f"INVALID {task.name}: {c.function.name} {c.function.arguments}", file=sys.stderr)


def grammar_only(tasks: list, docs: dict) -> None:
    import re

    from radixflow.errors import RadixflowError
    from radixflow.runtime.server.tool_formats import FORMATS
    from radixflow.runtime.server.tool_request import format_calls, grammar, parse_tools

    fmt, refused, truths, matched = FORMATS["generic"], [], 0, 0
    for task in tasks:
        try:
            regex = re.compile(grammar(parse_tools(task.tools), fmt, "required", None, True))
        except RadixflowError as e:
            refused.append((task.name, str(e)))
            continue
        for t in docs[task.name].get("tests", []):
            if t["valid"]:
                truths += 1
                calls = [{"name": k, "arguments": v} for k, v in t["data"].items()]
                if regex.fullmatch(format_calls(fmt, calls)):
                    matched += 1
                else:
                    print(f"no match {task.name}: {format_calls(fmt, calls)[:200]!r}")
    print(f"{len(tasks)} tasks: {len(tasks) - len(refused)} grammars built, {len(refused)} refused; "
          f"{matched} of {truths} ground-truth calls match their grammar")
    for name, message in refused:
        print(f"  refused {name}: {message}")


PHASES = [(0.0, True), (0.0, False), (1.0, True), (1.0, False)]  # (temperature, tools)


def run_chunks(tasks: list, args) -> tuple:
    """All phases chunk by chunk until the tasks or the time run out: (tasks done, totals per phase).
    Without --base-url one server serves the run, or with --server-per-chunk a fresh one each
    chunk (compiled grammars stay cached for a server's life: a thousand outlines grammars
    outgrow a small machine's memory; llguidance's do not)."""
    totals = {phase: Tally() for phase in PHASES}
    done, server = 0, None
    try:
        for begin in range(0, len(tasks), args.chunk):
            if args.stop_at and time.strftime("%H:%M", time.gmtime()) >= args.stop_at:
                break
            if server is None and not args.base_url:
                server = start_server(*args.server_args, api_key=None, startup_timeout_s=600)
            client = openai.OpenAI(base_url=(args.base_url or server.url) + "/v1", api_key="none", timeout=1800, max_retries=0)
            chunk = tasks[begin : begin + args.chunk]
            for temperature, tools in PHASES:
                totals[(temperature, tools)].add(run(client, chunk, tools, temperature, args.max_tokens, args.concurrency))
            if args.server_per_chunk:
                _stop(server)
                server = None
            done += len(chunk)
            print(f"after {done} of {len(tasks)} tasks ({time.strftime('%H:%M:%S', time.gmtime())} UTC):", flush=True)
            print_table(totals)
    finally:
        _stop(server)
    return done, totals


def _stop(server) -> None:
    if server is not None and server.stop() not in (0, None) and "died" in server.log():
        print(server.log()[-2000:])


def _rate(count: int, t: Tally) -> float:
    return count / t.seconds if t.seconds else 0.0


def print_table(totals: dict) -> None:
    print("| temperature | tools | requests | refused (400) | calls | parse | validate | answers without a call "
          "| finish length | errors | seconds | output tokens | out tok/s | requests/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (temperature, tools), t in totals.items():
        counts = f"{t.calls} | {t.parsed} | {t.valid} | {t.without_calls}" if tools else "- | - | - | -"
        print(f"| {temperature:g} | {'required' if tools else 'no tools'} | {t.requests} | {len(t.refused)} | {counts} | "
              f"{t.closed_by_length} | {len(t.errors)} | {t.seconds:.1f} | {t.out_tokens} | {_rate(t.out_tokens, t):.2f} | "
              f"{_rate(t.requests, t):.3f} |")  # fmt: skip
    for temperature in (0.0, 1.0):
        w, wo = totals[(temperature, True)], totals[(temperature, False)]
        if w.out_tokens and wo.out_tokens:
            print(f"  temperature {temperature:g}, with tools / without: out tok/s {_rate(w.out_tokens, w) / _rate(wo.out_tokens, wo):.2f}x, "
                  f"requests/s {_rate(w.requests, w) / _rate(wo.requests, wo):.2f}x")  # fmt: skip
    for (temperature, tools), t in totals.items():
        for name, message in t.errors:
            print(f"  ERROR at temperature {temperature:g} ({'tools' if tools else 'no tools'}) {name}: {message}")
        for name, message in t.refused:
            print(f"  refused at temperature {temperature:g} ({'tools' if tools else 'no tools'}) {name}: {message}")
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default=None, help="a running server; default: start one on the default model")
    ap.add_argument("--corpus", default=CORPUS)
    ap.add_argument("--sample", type=int, default=40, help="tasks drawn at random (0 = all 1,043)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=64, help="tasks per chunk (each through all four phases)")
    ap.add_argument("--stop-at", default=None, help="HH:MM UTC: start no chunk after this")
    ap.add_argument("--max-total-tokens", default="16384", help="of the servers this script starts")
    ap.add_argument("--compile-timeout-s", default="10", help="of the servers this script starts")
    ap.add_argument("--server-per-chunk", action="store_true", help="a fresh server for each chunk (outlines: memory)")
    ap.add_argument("--grammar-only", action="store_true", help="no model: check the grammars against the ground truth")
    args = ap.parse_args()
    docs: dict = {}
    tasks = load_tasks(args.corpus, args.sample, args.seed, docs)
    if args.grammar_only:
        return grammar_only(tasks, docs)
    args.server_args = ["--max-total-tokens", args.max_total_tokens, "--grammar-compile-timeout-s", args.compile_timeout_s]
    print(f"{len(tasks)} BFCL tasks (seed {args.seed}), max_tokens {args.max_tokens}, concurrency {args.concurrency}, "
          f"chunks of {args.chunk}, server {' '.join(args.server_args) if not args.base_url else args.base_url}", flush=True)  # fmt: skip
    done, _ = run_chunks(tasks, args)
    print(f"done: {done} of {len(tasks)} tasks" + ("" if done == len(tasks) else f" (stopped at {args.stop_at} UTC)"))

if __name__ == "__main__":
    main()
