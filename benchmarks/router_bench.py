"""Replicas behind sglang-router (`radixflow serve --dp-size 2`), on the default model.

policies: 8 prompt families, each a long shared prefix, asked in rounds (every round asks each
  family once, in a shuffled order), through the router with --router-policy cache_aware and then
  round_robin, each on fresh replicas. Reports the aggregate cache hit rate (the replicas'
  /metrics: cached / prompt tokens) and the throughput. The KV pool of a replica holds about five
  of the eight prefixes (default sizes), so which replica a family lands on decides whether it hits.
failover: 200 requests mixing native /generate (plain and streaming), OpenAI chat streaming and
  DSL programs (RuntimeEndpoint on the router), 4 at a time, with replica 0 killed (SIGKILL) when
  about half have finished and the next ones are running. Counts failures, split into those the router could have retried (nothing had reached
  the client yet) and those it could not (a stream cut mid-way), and whether the supervisor
  brought the replica back.

    python benchmarks/router_bench.py [--parts policies,failover] [--out results.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import httpx

from radixflow.runtime.child_processes import free_port

READY = "radixflow server ready at"
WORDS = ("river stone market signal garden ledger copper window harbor method planet circuit "
         "lantern orchard canvas engine meadow archive violet compass tunnel summit glacier "
         "thread anchor beacon cobalt falcon granite hollow ivory juniper kettle marble").split()  # fmt: skip


@dataclass
class DpServer:
    proc: subprocess.Popen
    url: str
    log_path: str

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def replicas(self) -> dict[int, tuple[int, str]]:
        found = {}
        for m in re.finditer(r"^replica (\d+) \(pid (\d+)\) ready at (\S+)$", self.log(), re.M):
            found[int(m.group(1))] = (int(m.group(2)), m.group(3))
        return found

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start(policy: str, max_total_tokens: int) -> DpServer:
    port = free_port()
    fd, log_path = tempfile.mkstemp(prefix="router-bench-", suffix=".log")
    cmd = [sys.executable, "-m", "radixflow", "serve", "--dp-size", "2", "--router-policy", policy,
           "--port", str(port), "--max-total-tokens", str(max_total_tokens), "--log-interval-s", "600"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT)
    os.close(fd)
    server = DpServer(proc, f"http://127.0.0.1:{port}", log_path)
    deadline = time.time() + 600
    while not re.search(rf"^{READY} http://127.0.0.1:{port}", server.log(), re.M):
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"server did not start:\n{server.log()[-3000:]}")
        time.sleep(0.5)
    return server


def hit_rate(server: DpServer) -> dict:
    """Prompt and cached tokens summed over the replicas' /metrics."""
    totals = {"prompt": 0.0, "cached": 0.0}
    for _, url in server.replicas().values():
        text = httpx.get(f"{url}/metrics", timeout=30).text
        for key, name in (("prompt", "radixflow:prompt_tokens_total"), ("cached", "radixflow:cached_tokens_total")):
            totals[key] += sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))
    return {**totals, "hit_rate": totals["cached"] / max(totals["prompt"], 1)}


# -- policies -------------------------------------------------------------------------------------
def family_prompts(families: int, rounds: int, prefix_words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    prefixes = [f"Manual {f}: " + " ".join(rng.choice(WORDS) for _ in range(prefix_words)) for f in range(families)]
    prompts = []
    for r in range(rounds):
        order = list(range(families))
        rng.shuffle(order)
        prompts += [f"{prefixes[f]}\nQuestion {r}: what does part {r} of manual {f} say?" for f in order]
    return prompts


def run_policy(policy: str, prompts: list[str], a) -> dict:
    server = start(policy, a.max_total_tokens)
    try:
        payload = {"sampling_params": {"max_new_tokens": a.max_new_tokens, "temperature": 0, "ignore_eos": True}}
        with httpx.Client(base_url=server.url, timeout=600) as c, cf.ThreadPoolExecutor(a.concurrency) as pool:
            t0 = time.time()
            outs = list(pool.map(lambda p: c.post("/generate", json={"text": p, **payload}), prompts))
            wall = time.time() - t0
        assert all(r.status_code == 200 for r in outs), [r.text for r in outs if r.status_code != 200][:3]
        metas = [r.json()["meta_info"] for r in outs]
        out_tokens = sum(m["completion_tokens"] for m in metas)
        result = {"policy": policy, "requests": len(prompts), "wall_s": wall, "req_per_s": len(prompts) / wall,
                  "out_tok_per_s": out_tokens / wall, "prompt_tokens_mean": sum(m["prompt_tokens"] for m in metas) / len(metas),
                  **hit_rate(server)}  # fmt: skip
    finally:
        server.stop()
    print(json.dumps(result), flush=True)
    return result


def policies(a) -> dict:
    prompts = family_prompts(a.families, a.rounds, a.prefix_words, a.seed)
    runs = {p: run_policy(p, prompts, a) for p in ("cache_aware", "round_robin")}
    ca, rr = runs["cache_aware"], runs["round_robin"]
    return {**runs, "hit_rate_ratio": ca["hit_rate"] / max(rr["hit_rate"], 1e-9),
            "throughput_ratio": ca["req_per_s"] / rr["req_per_s"]}  # fmt: skip


# -- failover -------------------------------------------------------------------------------------
def native(c: httpx.Client, i: int) -> tuple[bool, bool, str]:
    r = c.post("/generate", json={"text": f"Note {i}: the weather today is", "sampling_params": {"max_new_tokens": 8}})
    return r.status_code == 200, False, r.text[:200]


def native_stream(c: httpx.Client, i: int) -> tuple[bool, bool, str]:
    body = {"text": f"Story {i}: once upon a time", "stream": True, "sampling_params": {"max_new_tokens": 8}}
    return _stream(c, "/generate", body)


def chat_stream(c: httpx.Client, i: int) -> tuple[bool, bool, str]:
    body = {"model": "default", "messages": [{"role": "user", "content": f"Name a color ({i})."}], "max_tokens": 8, "stream": True}
    return _stream(c, "/v1/chat/completions", body)


def _stream(c: httpx.Client, path: str, body: dict) -> tuple[bool, bool, str]:
    """(ok, got data before failing, error text)."""
    got = False
    try:
        with c.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                return False, False, r.read().decode()[:200]
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    if '"error"' in line:
                        return False, got, line[:200]
                    got = True
                elif line == "data: [DONE]":
                    return True, got, ""
        return False, got, "stream ended without [DONE]"
    except httpx.HTTPError as e:
        return False, got, repr(e)


def program(backend, i: int) -> tuple[bool, bool, str]:
    import radixflow.lang as rl

    @rl.function
    def qa(s, topic):
        s += f"Topic {i}: {topic}. One word about it:" + rl.gen("a", max_tokens=4)
        s += " And another:" + rl.gen("b", max_tokens=4)

    try:
        state = qa.run(topic="the sea", backend=backend)
        return bool(state["a"] is not None and state["b"] is not None), False, ""
    except Exception as e:  # a failed program is a counted failure, not a crash of the benchmark
        return False, False, repr(e)[:200]


def failover(a) -> dict:
    from radixflow.lang.backends.runtime_endpoint import RuntimeEndpoint

    server = start("cache_aware", a.max_total_tokens)
    kinds = [native, native_stream, program] + ([chat_stream] if a.chat else [])
    try:
        backend = RuntimeEndpoint(server.url)
        pid0 = server.replicas()[0][0]
        half = a.requests // 2

        def timed(kind, i):
            start = time.time()
            return (kind.__name__, *kind(backend if kind is program else c, i), start, time.time())

        with httpx.Client(base_url=server.url, timeout=600) as c, cf.ThreadPoolExecutor(a.concurrency) as pool:
            t0 = time.time()
            futures = [pool.submit(timed, kinds[i % len(kinds)], i) for i in range(half)]
            cf.wait(futures[: half - a.concurrency])  # half done, the last few of that half running
            os.kill(pid0, signal.SIGKILL)
            killed = time.time()
            futures += [pool.submit(timed, kinds[i % len(kinds)], i) for i in range(half, a.requests)]
            results = [f.result() for f in futures]
            wall = time.time() - t0
        deadline = time.time() + 600
        while server.replicas()[0][0] == pid0 and time.time() < deadline:
            time.sleep(1)
        restarted = server.replicas()[0][0] != pid0
        after = httpx.post(f"{server.url}/generate", json={"text": "After the restart:", "sampling_params": {"max_new_tokens": 4}}, timeout=120)
        backend.close()
    finally:
        server.stop()
    failed = [r[:4] for r in results if not r[1]]
    by_kind = {k.__name__: sum(1 for r in results if r[0] == k.__name__) for k in kinds}
    in_flight = sum(1 for r in results if r[4] < killed < r[5])
    out = {"requests": len(results), "by_kind": by_kind, "wall_s": wall, "killed_at_s": killed - t0,
           "in_flight_at_kill": in_flight,
           "failed": len(failed), "failed_retryable": sum(1 for r in failed if not r[2]),
           "failed_mid_stream": sum(1 for r in failed if r[2]), "failures": failed[:10],
           "replica_restarted": restarted, "served_after_restart": after.status_code == 200}  # fmt: skip
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="policies,failover")
    p.add_argument("--families", type=int, default=8)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--prefix-words", type=int, default=400, help="about 1.5 tokens a word")
    p.add_argument("--max-total-tokens", type=int, default=2200, help="KV pool of each replica")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--no-chat", dest="chat", action="store_false", help="leave OpenAI chat out of the failover mix")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    report = {"args": vars(a), "load_avg_start": os.getloadavg()}
    parts = a.parts.split(",")
    if "policies" in parts:
        report["policies"] = policies(a)
    if "failover" in parts:
        report["failover"] = failover(a)
    report["load_avg_end"] = os.getloadavg()
    print(json.dumps(report, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
