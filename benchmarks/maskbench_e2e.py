"""End to end through the server: MaskBench schemas sampled across splits with a fixed seed,
generated at temperature 1 with the default model, every finished output validated with
`jsonschema` (format checks on).

    python benchmarks/maskbench_e2e.py --launch --schemas 300
    python benchmarks/maskbench_e2e.py --launch --budget 1.5 --schemas 300

`--budget F` sets each request's max_new_tokens to ceil(F x the grammar's shortest output
in tokens); the shortest output is what the server reports for the grammar when asked with
max_new_tokens=1 (a 400 naming it; the compile is cached, so the real request reuses it).
A probe that is not refused means a shortest output of 1 token, or none known (llguidance:
its search found none); such results carry `probe_ok`. Without --budget, max_new_tokens is
--max-new-tokens. Schemas the backend refuses (400) are counted, not generated.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import os
import re
import sys
import time

import httpx
from jsonschema import Draft202012Validator, validators

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from maskbench import DEFAULT_CORPUS, load_corpus, sample  # noqa: E402
from serving_helpers import start_server  # noqa: E402

SHORTEST = re.compile(r"shortest output takes (\d+) tokens")


def prompt_for(doc: dict) -> str:
    return f"Write one JSON value that follows this JSON schema.\nSchema: {json.dumps(doc['schema'])[:1500]}\nJSON:"


async def one(client: httpx.AsyncClient, name: str, doc: dict, args, seed: int) -> dict:
    schema = json.dumps(doc["schema"])
    params = {"json_schema": schema, "temperature": 1.0, "sampling_seed": seed, "max_new_tokens": args.max_new_tokens}
    if args.budget:
        probe = await client.post("/generate", json={"text": "x", "sampling_params": {**params, "max_new_tokens": 1}})
        m = SHORTEST.search(probe.text) if probe.status_code == 400 else None
        if probe.status_code == 400 and not m:
            return {"status": "refused", "reason": probe.json()["error"]["message"][:80]}
        shortest = int(m.group(1)) if m else 1
        params["max_new_tokens"] = max(1, math.ceil(args.budget * shortest))
        extra = {"shortest": shortest, "probe_ok": probe.status_code == 200}
    else:
        extra = {}
    r = await client.post("/generate", json={"text": prompt_for(doc), "sampling_params": params})
    if r.status_code == 400:
        return {"status": "refused", "reason": r.json()["error"]["message"][:80]}
    r.raise_for_status()
    out = r.json()
    reason = out["meta_info"]["finish_reason"]
    finish = reason["type"] + ("/grammar_closed" if reason.get("grammar_closed") else "")
    extra = {**extra, "finish": finish, "tokens": out["meta_info"].get("completion_tokens"), "name": name}
    try:
        value = json.loads(out["text"])
    except ValueError:
        return {"status": "invalid_json", **extra, "text": out["text"][-80:]}
    cls = validators.validator_for(doc["schema"], default=Draft202012Validator)
    errors = [e.message[:100] for e in cls(doc["schema"], format_checker=cls.FORMAT_CHECKER).iter_errors(value)]
    return {"status": "valid" if not errors else "invalid", **extra, "errors": errors[:2]}


async def run(url: str, docs: list, args) -> list:
    sem = asyncio.Semaphore(args.concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=3600) as client:

        async def guarded(i, name, doc):
            async with sem:
                try:
                    r = await one(client, name, doc, args, args.seed + i)
                except httpx.HTTPError as e:  # the server failed (or is gone): a result, not a crash
                    r = {"status": "error", "name": name, "error": f"{type(e).__name__}: {e}"[:120]}
            if args.results:  # as each finishes, so an interrupted run still leaves its count
                with open(args.results, "a") as f:
                    f.write(json.dumps(r) + "\n")
            return r

        return await asyncio.gather(*(guarded(i, n, d) for i, (n, _, d) in enumerate(docs)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default=DEFAULT_CORPUS)
    p.add_argument("--schemas", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grammar-backend", default="llguidance")
    p.add_argument("--budget", type=float, default=0.0, help="max_new_tokens = ceil(F x shortest output)")
    p.add_argument("--max-new-tokens", type=int, default=1024)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--url", default=None, help="a running server (else --launch)")
    p.add_argument("--launch", action="store_true")
    p.add_argument("--json", default=None)
    p.add_argument("--results", default=None, help="append every request's result here as it finishes (JSON lines)")
    p.add_argument("--server-args", default="", help="more `radixflow serve` flags for --launch, as one string")
    args = p.parse_args()
    docs = sample(load_corpus(args.corpus), args.schemas, args.seed)
    server = None if args.url else start_server("--grammar-backend", args.grammar_backend, "--max-new-tokens-limit", "4096",
                                                *args.server_args.split(), api_key=None, startup_timeout_s=600)  # fmt: skip
    url = args.url or server.url
    start = time.time()
    try:
        results = asyncio.run(run(url, docs, args))
    finally:
        if server is not None:
            server.stop()
    tally = collections.Counter(r["status"] for r in results)
    finishes = collections.Counter((r["status"], r.get("finish")) for r in results if "finish" in r)
    finished = [r for r in results if "finish" in r]
    summary = {
        "schemas": len(docs), "backend": args.grammar_backend, "budget": args.budget, "seconds": round(time.time() - start),
        "status": dict(tally), "by_finish": {f"{s}/{f}": n for (s, f), n in finishes.items()},
        "finished": len(finished), "finished_valid": sum(r["status"] == "valid" for r in finished),
        "stopped_valid": sum(r["status"] == "valid" for r in finished if r["finish"] == "stop"),
        "stopped": sum(r["finish"] == "stop" for r in finished),
        "refusals": collections.Counter(r["reason"] for r in results if r["status"] == "refused").most_common(10),
        "bad_examples": [r for r in results if r["status"] in ("invalid", "invalid_json")][:5],
    }  # fmt: skip
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)



if __name__ == "__main__":
    main()
