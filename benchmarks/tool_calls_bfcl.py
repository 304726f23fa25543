"""Tool calls on the BFCL function schemas of MaskBench: do the returned calls parse and validate?

Each BFCL_* file of ../shared/data/maskbench-dev.tar.gz holds one task's functions (a schema
`{"properties": {NAME: PARAMETERS}}`, or an anyOf of several) and a ground-truth call. Each task
becomes a chat request with those functions as `tools` and `tool_choice: "required"`; the user
message asks for the ground-truth call in words (the corpus keeps no BFCL question). Every
returned call is checked: its arguments parse as JSON and validate (jsonschema) against its
function's parameters. Two same-run baselines, for the throughput ratio: the same tools with
`tool_choice: "none"` (the same prompt, the functions listed in it, nothing constrained) and
the same messages without tools (a prompt several times shorter).

    python benchmarks/tool_calls_bfcl.py --sample 40                 # starts a server on the default model
    python benchmarks/tool_calls_bfcl.py --base-url http://127.0.0.1:30000 --sample 0   # all 1,043
    python benchmarks/tool_calls_bfcl.py --sample 0 --chunk 32 --stop-at 20:15   # as many as fit, in order
    python benchmarks/tool_calls_bfcl.py --grammar-only --sample 0   # no model: grammars vs ground truth

The tasks run in a fixed-seed order stratified by split (every prefix holds each BFCL split
in proportion), `--chunk` at a time, each chunk through all six phases (temperature 0 and 1;
`required`, `none`, no tools), the radix cache flushed before each, before the next chunk; the
tables (all calls, then per split) are printed after every chunk and written to `--out`. With
`--stop-at HH:MM` (UTC) or `--time-budget-s` no chunk starts that would not fit, so a run that
cannot finish reports a fixed-seed prefix of whole chunks, every task of it counted. One
server serves the whole run (`--grammar-backend`, default llguidance: like for like with the
session-6 H200 row, not the server default auto); `--server-per-chunk` starts a
fresh one per chunk. On a GPU machine (the server on CUDA):

    python benchmarks/tool_calls_bfcl.py --sample 0 --chunk 261 --concurrency 261 --max-tokens 128 --warmup 8 \
        --max-total-tokens 262144 --server-extra "--cuda-graph-max-bs 288" --time-budget-s 200 --out bfcl.json

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
import shlex
import shutil
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field

import httpx
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
    prompt_tokens: int = 0
    out_tokens: int = 0
    seconds: float = 0.0

    def add(self, other: "Tally") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def counts(self) -> dict:
        return {k: (len(v) if isinstance(v, list) else v) for k, v in vars(self).items()}


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


def split_of(task: Task) -> str:
    return task.name.rsplit("_", 1)[0]  # BFCL_parallel_12 -> BFCL_parallel


@dataclass
class Phase:
    splits: dict = field(default_factory=dict)  # BFCL split -> Tally (their seconds stay 0)
    seconds: float = 0.0  # wall time of the phase, all splits at once

    def total(self) -> Tally:
        total = Tally(seconds=self.seconds)
        for t in self.splits.values():
            total.add(t)
        return total


def run(client, tasks: list, mode: str, temperature: float, max_tokens: int, concurrency: int, phase: Phase) -> None:
    """One phase over `tasks`, counted into `phase`."""
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        for task, result in zip(tasks, pool.map(lambda t: _one(client, t, mode, temperature, max_tokens), tasks)):
            _count(phase.splits.setdefault(split_of(task), Tally()), task, mode, result)
    phase.seconds += time.perf_counter() - start


def _one(client, task: Task, mode: str, temperature: float, max_tokens: int):
    extra = {} if mode == NO_TOOLS else {"tools": task.tools, "tool_choice": mode}
    try:
        return client.chat.completions.create(model="default", messages=task.messages, temperature=temperature,
                                              max_tokens=max_tokens, seed=0, **extra)  # fmt: skip
    except openai.APIError as e:  # a 400 is counted as refused, anything else as an error
        return e


def _count(tally: Tally, task: Task, mode: str, r) -> None:
    tally.requests += 1
    if isinstance(r, openai.BadRequestError):
        tally.refused.append((task.name, r.response.json()["error"]["message"]))
        return
    if isinstance(r, openai.APIError):
        tally.errors.append((task.name, f"{type(r).__name__}: {r}"))
        return
    tally.prompt_tokens += r.usage.prompt_tokens
    tally.out_tokens += r.usage.completion_tokens
    tally.closed_by_length += r.choices[0].finish_reason == "length"
    if mode != "required":
        return
    calls = r.choices[0].message.tool_calls or []
    tally.without_calls += not calls
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


NO_TOOLS = "no tools"
# (temperature, mode): mode "required" = tools + tool_choice "required" (the calls under the grammar);
# "none" = the same tools + tool_choice "none": the same prompt (the functions listed in it), nothing
# constrained, so its throughput differs from "required" by the grammar and the output alone;
# NO_TOOLS = the same messages without tools (a prompt several times shorter).
PHASES = [(t, mode) for t in (0.0, 1.0) for mode in ("required", "none", NO_TOOLS)]


def run_chunks(tasks: list, args) -> tuple:
    """All phases chunk by chunk until the tasks or the time run out: (tasks done, {phase: {split: Tally}}).
    Without --base-url one server serves the run, or with --server-per-chunk a fresh one each
    chunk (compiled grammars stay cached for a server's life: a thousand outlines grammars
    outgrow a small machine's memory; llguidance's do not). The radix cache is flushed before
    each phase, so no phase reuses another's prompts."""
    totals = {phase: Phase() for phase in PHASES}
    done, server, began, last = 0, None, time.perf_counter(), 0.0
    try:
        for begin in range(0, len(tasks), args.chunk):
            if args.stop_at and time.strftime("%H:%M", time.gmtime()) >= args.stop_at:
                break
            if args.time_budget_s and time.perf_counter() - began + last > args.time_budget_s:
                break  # the next chunk would not finish inside the budget if it takes as long as the last
            if server is None and not args.base_url:
                server = start_server(*args.server_args, api_key=None, startup_timeout_s=600)
            url = args.base_url or server.url
            client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=1800, max_retries=0)
            if begin == 0 and args.warmup:
                warm_up(client, tasks[: args.warmup], args)
            chunk_start = time.perf_counter()
            chunk = tasks[begin : begin + args.chunk]
            for temperature, mode in PHASES:
                flush_cache(url)
                run(client, chunk, mode, temperature, args.max_tokens, args.concurrency, totals[(temperature, mode)])
            if args.server_per_chunk:
                _stop(server, args.out)
                server = None
            done += len(chunk)
            last = time.perf_counter() - chunk_start
            print(f"after {done} of {len(tasks)} tasks ({time.strftime('%H:%M:%S', time.gmtime())} UTC, chunk {last:.0f} s):", flush=True)
            print_table(totals)
            if args.out:
                write_json(args.out, totals, done, len(tasks), args)
    finally:
        _stop(server, args.out)
    return done, totals


def warm_up(client, tasks: list, args) -> None:
    """The given tasks through every phase, not counted: kernels compiled on first use (Triton's
    on a GPU) are then not timed in the first phase."""
    for temperature, mode in PHASES:
        run(client, tasks, mode, temperature, args.max_tokens, args.concurrency, Phase())


def flush_cache(url: str) -> None:
    deadline = time.time() + 30
    while httpx.post(url + "/flush_cache", timeout=30).status_code != 200:  # 400 while aborts finish
        if time.time() > deadline:
            raise RuntimeError("the server did not flush its cache within 30 s of a phase's end")
        time.sleep(0.2)


def _stop(server, out: str = None) -> None:
    if server is None:
        return
    if server.stop() not in (0, None) and "died" in server.log():
        print(server.log()[-2000:])
    if out:  # beside the JSON: OUT.server.log (the last server's, with --server-per-chunk)
        shutil.copy(server.log_path, os.path.splitext(out)[0] + ".server.log")


def _rate(count: float, t: Tally) -> float:
    return count / t.seconds if t.seconds else 0.0


def _mean(count: int, t: Tally) -> float:
    served = t.requests - len(t.refused) - len(t.errors)
    return count / served if served else 0.0


def print_table(totals: dict) -> None:
    print("| temperature | tools | requests | refused (400) | calls | parse | validate | answers without a call "
          "| finish length | errors | seconds | prompt tok/request | output tok/request | out tok/s | (prompt + output) tok/s | requests/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    phase = {p: result.total() for p, result in totals.items()}
    for (temperature, mode), t in phase.items():
        counts = f"{t.calls} | {t.parsed} | {t.valid} | {t.without_calls}" if mode == "required" else "- | - | - | -"
        label = {"required": "required", "none": 'same tools, tool_choice "none"', NO_TOOLS: NO_TOOLS}[mode]
        print(f"| {temperature:g} | {label} | {t.requests} | {len(t.refused)} | {counts} | {t.closed_by_length} | "
              f"{len(t.errors)} | {t.seconds:.1f} | {_mean(t.prompt_tokens, t):.1f} | {_mean(t.out_tokens, t):.1f} | "
              f"{_rate(t.out_tokens, t):.1f} | {_rate(t.prompt_tokens + t.out_tokens, t):.1f} | {_rate(t.requests, t):.2f} |")  # fmt: skip
    for temperature in (0.0, 1.0):
        w = phase[(temperature, "required")]
        for base in ("none", NO_TOOLS):
            b = phase[(temperature, base)]
            if w.out_tokens and b.out_tokens:
                print(f"  temperature {temperature:g}, required / {base}: out tok/s {_rate(w.out_tokens, w) / _rate(b.out_tokens, b):.2f}x, "
                      f"requests/s {_rate(w.requests, w) / _rate(b.requests, b):.2f}x; prompt tok/request "
                      f"{_mean(w.prompt_tokens, w):.0f} vs {_mean(b.prompt_tokens, b):.0f}, output tok/request "
                      f"{_mean(w.out_tokens, w):.0f} vs {_mean(b.out_tokens, b):.0f}")  # fmt: skip
    print_splits(totals)
    for (temperature, mode), result in totals.items():
        for t in result.splits.values():
            for name, message in t.errors:
                print(f"  ERROR at temperature {temperature:g} ({mode}) {name}: {message}")
            for name, message in t.refused:
                print(f"  refused at temperature {temperature:g} ({mode}) {name}: {message}")
    sys.stdout.flush()


def print_splits(totals: dict) -> None:
    """The calls of the `required` phases per BFCL split."""
    print("| split | tasks | T 0 calls / parse / validate / refused / errors | T 1 calls / parse / validate / refused / errors |")
    print("| --- | --- | --- | --- |")
    for split in sorted(totals[(0.0, "required")].splits):
        cells = []
        for temperature in (0.0, 1.0):
            t = totals[(temperature, "required")].splits.get(split, Tally())
            cells.append(f"{t.calls} / {t.parsed} / {t.valid} / {len(t.refused)} / {len(t.errors)}")
        print(f"| {split} | {totals[(0.0, 'required')].splits[split].requests} | {cells[0]} | {cells[1]} |")


def write_json(path: str, totals: dict, done: int, of: int, args) -> None:
    phases = []
    for (temperature, mode), result in totals.items():
        phases.append({"temperature": temperature, "mode": mode, "total": result.total().counts(),
                       "splits": {k: t.counts() for k, t in sorted(result.splits.items())},
                       "refused": [r for t in result.splits.values() for r in t.refused],
                       "errors": [e for t in result.splits.values() for e in t.errors]})
    settings = {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool, list, type(None)))}
    with open(path, "w") as f:
        json.dump({"tasks_done": done, "tasks": of, "settings": settings, "phases": phases}, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default=None, help="a running server; default: start one on the default model")
    ap.add_argument("--corpus", default=CORPUS)
    ap.add_argument("--sample", type=int, default=40, help="tasks drawn at random (0 = all 1,043)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=64, help="tasks per chunk (each through all six phases)")
    ap.add_argument("--stop-at", default=None, help="HH:MM UTC: start no chunk after this")
    ap.add_argument("--time-budget-s", type=float, default=None,
                    help="start no chunk unless it fits in this many seconds from the start, taking as long as the last")
    ap.add_argument("--warmup", type=int, default=0, help="send the first N tasks through every phase first, uncounted")
    ap.add_argument("--out", default=None, help="write the counts as JSON here after every chunk")
    ap.add_argument("--model-path", default=None, help="of the servers this script starts (default: the default model)")
    ap.add_argument("--server-extra", default="", help="more flags for the servers this script starts, e.g. '--cuda-graph-max-bs 288'")
    ap.add_argument("--max-total-tokens", default="16384", help="of the servers this script starts ('auto': from GPU memory)")
    ap.add_argument("--compile-timeout-s", default="10", help="of the servers this script starts")
    ap.add_argument("--grammar-backend", default="llguidance", choices=["llguidance", "outlines", "auto"],
                    help="of the servers this script starts (llguidance: as the recorded rows ran)")
    ap.add_argument("--server-per-chunk", action="store_true", help="a fresh server for each chunk (outlines: memory)")
    ap.add_argument("--grammar-only", action="store_true", help="no model: check the grammars against the ground truth")
    args = ap.parse_args()
    docs: dict = {}
    tasks = load_tasks(args.corpus, args.sample, args.seed, docs)
    if args.grammar_only:
        return grammar_only(tasks, docs)
    args.server_args = ["--grammar-compile-timeout-s", args.compile_timeout_s, "--grammar-backend", args.grammar_backend,
                        *shlex.split(args.server_extra)]
    if args.max_total_tokens != "auto":
        args.server_args += ["--max-total-tokens", args.max_total_tokens]
    if args.model_path:
        args.server_args += ["--model-path", args.model_path]
    print(f"{len(tasks)} BFCL tasks (seed {args.seed}), max_tokens {args.max_tokens}, concurrency {args.concurrency}, "
          f"chunks of {args.chunk}, server {' '.join(args.server_args) if not args.base_url else args.base_url}", flush=True)  # fmt: skip
    done, _ = run_chunks(tasks, args)
    print(f"done: {done} of {len(tasks)} tasks" + ("" if done == len(tasks) else " (stopped by --stop-at / --time-budget-s)"))

if __name__ == "__main__":
    main()
