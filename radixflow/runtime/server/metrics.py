"""Prometheus metrics of one server (prometheus_client, a registry per server).

Gauges come from the scheduler's periodic stats snapshot; counters and latency
histograms are recorded in the main process as outputs reach it.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from radixflow.runtime.server.server_messages import StatsSnapshot

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5, 5)


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        r, labels = self.registry, {"model_name": model_name}

        def gauge(name, doc):
            return Gauge(f"radixflow:{name}", doc, list(labels), registry=r).labels(**labels)

        def counter(name, doc):
            return Counter(f"radixflow:{name}", doc, list(labels), registry=r).labels(**labels)

        def histogram(name, doc, buckets):
            return Histogram(f"radixflow:{name}", doc, list(labels), buckets=buckets, registry=r).labels(**labels)

        self.num_running = gauge("num_running_reqs", "Requests in the running batch")
        self.num_waiting = gauge("num_queue_reqs", "Requests waiting to be scheduled")
        self.token_usage = gauge("token_usage", "Fraction of KV slots in use (0-1)")
        self.cache_hit_rate = gauge("cache_hit_rate", "Prompt tokens served from the radix cache / prompt tokens")
        self.gen_throughput = gauge("gen_throughput", "Generation throughput (token/s)")
        self.grammar_rows_switched = gauge("grammar_rows_switched",
                                           "Running rows auto moved from llguidance to outlines, since start")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = counter("generation_tokens", "Generated tokens")
        self.cached_tokens = counter("cached_tokens", "Prompt tokens served from the radix cache")
        self.requests = counter("num_requests", "Finished requests")
        self.ttft = histogram("time_to_first_token_seconds", "Time to first token", _LATENCY_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Time between output tokens", _ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "End-to-end request latency", _LATENCY_BUCKETS)

    def on_stats(self, s: StatsSnapshot) -> None:
        self.num_running.set(s.num_running)
        self.num_waiting.set(s.num_waiting)
        self.token_usage.set(s.token_usage)
        self.cache_hit_rate.set(s.cache_hit_rate)
        self.gen_throughput.set(s.gen_throughput)
        self.grammar_rows_switched.set(s.grammar_rows_switched)

    def on_tokens(self, first: bool, since_last: float, new_tokens: int, since_start: float) -> None:
        if new_tokens <= 0:
            return
        self.generation_tokens.inc(new_tokens)
        if first:
            self.ttft.observe(since_start)
            new_tokens -= 1
        for _ in range(min(new_tokens, 64)):
            self.itl.observe(since_last / max(new_tokens, 1))

    def on_finish(self, prompt_tokens: int, cached_tokens: int, e2e: float, generated: int = 0) -> None:
        """`generated`: output tokens not already counted by on_tokens (a request graph's)."""
        self.requests.inc()
        self.generation_tokens.inc(generated)
        self.prompt_tokens.inc(prompt_tokens)
        self.cached_tokens.inc(cached_tokens)
        self.e2e.observe(e2e)

    def render(self) -> bytes:
        return generate_latest(self.registry)
