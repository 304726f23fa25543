"""Online serving benchmark: a load generator for any OpenAI-compatible or SGLang-native
endpoint (radixflow, SGLang, vLLM, ...).

Requests arrive as a Poisson process at --request-rate (inf = all at once), optionally
capped at --max-concurrency in flight. Prompts are generated locally (no downloads):
  random    input/output lengths uniform in [len * (1 - range_ratio), len]
  sharegpt  log-normal lengths shaped like ShareGPT conversations (long-tailed)
--shared-prefix-len puts the same system prefix in front of every prompt, so a
radix cache can serve it (the cache hit rate is reported from the server's counts).
Every request streams, so TTFT and inter-token latency are measured client-side.

    python benchmarks/serving.py --base-url http://127.0.0.1:30000 --backend native \\
        --num-prompts 64 --request-rate 4 --dataset random --input-len 128 --output-len 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

import httpx

WORDS = ("the of and to in is was for on that with as by at from his her an which are be this had not but were "
         "have one all their there been has when who will more no if out so said what up its about into than them "
         "can only other new some could time these two may then do first any my now such like our over man me even "
         "most made after also did many before must through back years where much your way well down should because "
         "each just those people how too little state good very make world still own see men work long get here "
         "between both life being under never day same another know while last might us great old year off come "
         "since against go came right used take three").split()  # fmt: skip


@dataclass
class Request:
    prompt: str
    output_len: int


@dataclass
class Result:
    ok: bool = False
    error: str = ""
    start: float = 0.0
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0


# -- workload -------------------------------------------------------------------------------------------
def make_requests(args: argparse.Namespace) -> list[Request]:
    rng = random.Random(args.seed)
    prefix = _words(rng, args.shared_prefix_len) + "\n" if args.shared_prefix_len else ""
    reqs = []
    for _ in range(args.num_prompts):
        n_in, n_out = _lengths(rng, args)
        reqs.append(Request(prefix + _words(rng, n_in), n_out))
    return reqs


def _lengths(rng: random.Random, args: argparse.Namespace) -> tuple[int, int]:
    if args.dataset == "sharegpt":  # medians ~ ShareGPT's (in ~ 200, out ~ 180 tokens), long tails
        n_in = int(min(max(rng.lognormvariate(math.log(args.input_len), 0.9), 4), 4 * args.input_len))
        n_out = int(min(max(rng.lognormvariate(math.log(args.output_len), 0.8), 2), 4 * args.output_len))
        return n_in, n_out
    lo = lambda n: max(int(n * (1 - args.range_ratio)), 1)  # noqa: E731
    return rng.randint(lo(args.input_len), args.input_len), rng.randint(lo(args.output_len), args.output_len)


def _words(rng: random.Random, n: int) -> str:
    """About n tokens of English-looking text (common words are single tokens)."""
    return " ".join(rng.choice(WORDS) for _ in range(n))


# -- protocols ----------------------------------------------------------------------------------------------
def request_body(args: argparse.Namespace, r: Request) -> tuple[str, dict]:
    if args.backend == "native":
        sp = {"max_new_tokens": r.output_len, "temperature": args.temperature, "ignore_eos": True}
        lp = {} if args.logprobs is None else {"return_logprob": True, "top_logprobs_num": args.logprobs}
        return "/generate", {"text": r.prompt, "sampling_params": sp, "stream": True, **lp}
    common = {"model": args.model, "max_tokens": r.output_len, "temperature": args.temperature, "stream": True,
              "stream_options": {"include_usage": True}, "ignore_eos": True}  # fmt: skip
    if args.backend == "openai-chat":
        lp = {} if args.logprobs is None else {"logprobs": True, "top_logprobs": args.logprobs}
        return "/v1/chat/completions", {**common, **lp, "messages": [{"role": "user", "content": r.prompt}]}
    lp = {} if args.logprobs is None else {"logprobs": args.logprobs}
    return "/v1/completions", {**common, **lp, "prompt": r.prompt}


def parse_event(backend: str, data: dict, state: dict) -> int:
    """New output tokens in this event; fills usage into `state`."""
    if "error" in data:
        raise RuntimeError(data["error"].get("message", str(data["error"])))
    if backend == "native":
        meta = data["meta_info"]
        state.update(prompt=meta["prompt_tokens"], cached=meta.get("cached_tokens", 0), out=meta["completion_tokens"])
        new = meta["completion_tokens"] - state.get("seen", 0)
        state["seen"] = meta["completion_tokens"]
        return new
    usage = data.get("usage")
    if usage:
        details = usage.get("prompt_tokens_details") or {}
        state.update(prompt=usage["prompt_tokens"], cached=details.get("cached_tokens", 0), out=usage["completion_tokens"])
    choices = data.get("choices") or []
    if not choices:
        return 0
    c = choices[0]
    piece = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
    return 1 if piece else 0


async def send(client: httpx.AsyncClient, args: argparse.Namespace, r: Request) -> Result:
    path, body = request_body(args, r)
    res = Result(start=time.perf_counter())
    state: dict = {}
    last = res.start
    try:
        async with client.stream("POST", path, json=body) as resp:
            if resp.status_code != 200:
                raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")
            async for line in resp.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                new = parse_event(args.backend, json.loads(line[5:]), state)
                if new <= 0:
                    continue
                now = time.perf_counter()
                if not res.ttft:
                    res.ttft = now - res.start
                else:
                    res.itl.extend([(now - last) / new] * new)
                last = now
        res.e2e = time.perf_counter() - res.start
        res.prompt_tokens, res.cached_tokens = state.get("prompt", 0), state.get("cached", 0)
        res.output_tokens = state.get("out", 0)
        res.ok = res.output_tokens > 0
    except Exception as e:  # counted as a failure, the run goes on
        res.error = f"{type(e).__name__}: {e}"
    return res


# -- driver -----------------------------------------------------------------------------------------------------
async def run(args: argparse.Namespace, reqs: list[Request]) -> tuple[list[Result], float]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    sem = asyncio.Semaphore(args.max_concurrency or len(reqs))
    rng = random.Random(args.seed + 1)

    async with httpx.AsyncClient(base_url=args.base_url, headers=headers, timeout=args.timeout, limits=limits) as client:

        async def one(r: Request) -> Result:
            async with sem:
                return await send(client, args, r)

        t0 = time.perf_counter()
        tasks = []
        for r in reqs:
            tasks.append(asyncio.create_task(one(r)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        return results, time.perf_counter() - t0


def pct(values: list, p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(int(round(p / 100 * (len(s) - 1))), len(s) - 1)]


def summarize(results: list[Result], duration: float) -> dict:
    ok = [r for r in results if r.ok]
    itl = [x for r in ok for x in r.itl]
    prompt = sum(r.prompt_tokens for r in ok)
    out = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "input_tok_s": prompt / duration,
        "output_tok_s": sum(r.output_tokens for r in ok) / duration,
        "cache_hit_rate": sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0,
        "mean_ttft_ms": 1000 * statistics.fmean([r.ttft for r in ok]) if ok else float("nan"),
    }
    for name, vals in (("ttft", [r.ttft for r in ok]), ("itl", itl), ("e2e", [r.e2e for r in ok])):
        out[f"p50_{name}_ms"] = 1000 * pct(vals, 50)
        out[f"p99_{name}_ms"] = 1000 * pct(vals, 99)
    errors = sorted({r.error for r in results if r.error})
    if errors:
        out["errors"] = errors[:5]
    return out


def print_report(args: argparse.Namespace, s: dict) -> None:
    print(f"== serving benchmark: {args.backend} {args.base_url}, dataset={args.dataset}, "
          f"rate={args.request_rate}, max_concurrency={args.max_concurrency or 'none'} ==")  # fmt: skip
    for k, v in s.items():
        print(f"{k:>20}: {v:.3f}" if isinstance(v, float) else f"{k:>20}: {v}")


def offline_transformers(args: argparse.Namespace, reqs: list[Request]) -> dict:
    """For scale: the same prompts through transformers' batched generate (greedy,
    left-padded batches of --hf-batch that run until their longest output), offline."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from radixflow.model_files import resolve_model

    path = resolve_model(args.hf_model).path
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    t0 = time.perf_counter()
    for i in range(0, len(reqs), args.hf_batch):
        part = reqs[i : i + args.hf_batch]
        enc = tok([r.prompt for r in part], return_tensors="pt", padding=True)
        longest = max(r.output_len for r in part)
        with torch.no_grad():
            model.generate(**enc, max_new_tokens=longest, min_new_tokens=longest, do_sample=False, pad_token_id=pad)
    dt = time.perf_counter() - t0
    return {"requests": len(reqs), "duration_s": dt, "request_throughput": len(reqs) / dt,
            "output_tok_s": sum(r.output_len for r in reqs) / dt}  # fmt: skip


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:30000")
    ap.add_argument("--backend", choices=("native", "openai-completions", "openai-chat"), default="native")
    ap.add_argument("--model", default="default", help="model name sent to OpenAI endpoints")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (Poisson); inf = all at once")
    ap.add_argument("--max-concurrency", type=int, default=0, help="cap on requests in flight (0 = no cap)")
    ap.add_argument("--dataset", choices=("random", "sharegpt"), default="random")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--range-ratio", type=float, default=0.5)
    ap.add_argument("--shared-prefix-len", type=int, default=0, help="words of common prefix in every prompt")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--logprobs", type=int, default=None,
                    help="ask every token's logprob and this many top logprobs (0: the token's only), streamed")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output-json", default=None, help="append the summary as one JSON line here")
    ap.add_argument("--offline-transformers", action="store_true",
                    help="no server: run the same prompts through transformers offline, for scale")
    ap.add_argument("--hf-model", default=None, help="model for --offline-transformers (default: radixflow's)")
    ap.add_argument("--hf-batch", type=int, default=16)
    return ap.parse_args(argv)


def main(argv: Optional[list] = None) -> int:
    args = parse_args(argv)
    reqs = make_requests(args)
    if args.offline_transformers:
        print("== transformers offline, same prompts ==")
        for k, v in offline_transformers(args, reqs).items():
            print(f"{k:>20}: {v:.3f}" if isinstance(v, float) else f"{k:>20}: {v}")
        return 0
    results, duration = asyncio.run(run(args, reqs))
    summary = summarize(results, duration)
    print_report(args, summary)
    if args.output_json:
        with open(args.output_json, "a") as f:
            f.write(json.dumps({"args": vars(args), "summary": summary, "time": time.time()}) + "\n")
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
