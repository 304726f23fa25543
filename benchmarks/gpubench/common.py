"""Shared plumbing of benchmarks/gpu_bench.py: options, sizes, engines, timers, byte and FLOP counts."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import random
import statistics
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "benchmarks", "configs")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
TOKENIZER_VOCAB = 49152  # SmolLM2's; random prompt ids stay below it
RESULTS: dict = {}
OPTS = argparse.Namespace()  # gpu_bench.py's parsed flags (filled in place)
# workload sizes; --smoke (CPU, tiny model) shrinks them to check the script's plumbing
SIZES = dict(offline=1000, in_max=1024, out_max=512, shared_n=256, shared_len=4096, shared_out=128, idle_bs=64,
             idle_out=256, prefill_n=8, prefill_len=2048, bs1_out=256, corr_shared=300, corr_long=1500, corr_chunk=512,
             hf_bs1_out=64, tiny_new=32, hf_compile_out=128, k1_n=1000, k1_len=1000, prof_n=512, prof_len=640, prof_out=48,
             pa_tokens=8192, pa_max=1024, pa_check=3, pa_reps=20,
             rb_rows=8192, rb_blocks=(1024, 2048, 4096), lp_len=8000, lp_top=5)
SMOKE = dict(offline=12, in_max=64, out_max=16, shared_n=6, shared_len=96, shared_out=8, idle_bs=4, idle_out=12,
             prefill_n=2, prefill_len=64, bs1_out=16, corr_shared=24, corr_long=80, corr_chunk=32, hf_bs1_out=8, tiny_new=8,
             hf_compile_out=12, k1_n=6, k1_len=24, prof_n=6, prof_len=40, prof_out=6,
             pa_tokens=96, pa_max=40, pa_check=2, pa_reps=1,
             rb_rows=64, rb_blocks=(16, 32), lp_len=80, lp_top=5)
TINY_CONFIG = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=TOKENIZER_VOCAB, max_position_embeddings=4096,
    rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
)
SZ = dict(SIZES)
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def parse_sizes(text: str) -> dict:
    """"prof_n=800,prof_len=600" -> {"prof_n": 800, "prof_len": 600}; names must be SIZES' and values integers."""
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, eq, value = item.partition("=")
        if not eq or name not in SIZES or isinstance(SIZES[name], tuple):
            raise ValueError(f"--sizes: {item!r} is not NAME=INT with NAME one of "
                             f"{', '.join(k for k, v in SIZES.items() if not isinstance(v, tuple))}")
        try:
            out[name] = int(value)
        except ValueError:
            raise ValueError(f"--sizes: {name}={value!r} is not an integer") from None
    return out


class Event:
    """A CUDA timing event; a host clock on CPU (smoke runs)."""

    def __init__(self):
        self.ev = torch.cuda.Event(enable_timing=True) if DEV == "cuda" else None
        self.t = 0.0

    def record(self) -> None:
        if self.ev is not None:
            self.ev.record()
        self.t = time.perf_counter()

    def elapsed_time(self, other: "Event") -> float:
        return self.ev.elapsed_time(other.ev) if self.ev is not None else 1e3 * (other.t - self.t)


def log(msg: str) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    with open(os.path.join(OPTS.out, "bench.log"), "a") as f:
        f.write(line + "\n")


def save() -> None:
    with open(os.path.join(OPTS.out, "results.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)


def config_path(config: str) -> str:
    if OPTS.smoke:
        path = "/tmp/radixflow-smoke-config.json"
        with open(path, "w") as f:
            json.dump(TINY_CONFIG, f)
        return path
    return os.path.join(CONFIGS, f"{config}.json")


def make_engine(config: str, **kw):
    import radixflow

    path = config if os.path.isdir(config) else config_path(config)
    if OPTS.smoke:
        kw.update(device="cpu", dtype="float32")
        kw.pop("mem_fraction_static", None)
        kw.setdefault("max_total_tokens", 8192)
    if OPTS.p_parts:
        kw.setdefault("attention_p_parts", OPTS.p_parts)
    if not os.path.isdir(path):
        kw.setdefault("load_format", "dummy")
        kw.setdefault("tokenizer_path", OPTS.tokenizer)
    settings = kw.pop("kernel_settings", None)  # KernelSettings fields with no server flag, set after the build
    t = time.perf_counter()
    engine = radixflow.Engine(path, **kw)
    if settings:
        engine.runner.set_kernel_settings(dataclasses.replace(engine.runner.settings, **settings))
    graphs = engine.runner.graph_runner  # kw's cuda_graph_max_bs None means the engine's own limit: log the one in effect
    log(f"engine {config} {kw} ready in {time.perf_counter() - t:.1f}s; "
        + (f"CUDA graphs up to batch {graphs.max_bs}" if graphs is not None else "no CUDA graphs"))
    return engine


def past_deadline(margin_s: float = 0) -> bool:
    """Whether gpu_bench's --deadline-s, less `margin_s`, has passed (counted from the script's start, OPTS.start)."""
    return bool(getattr(OPTS, "deadline_s", 0)) and time.perf_counter() - OPTS.start > OPTS.deadline_s - margin_s


def free(*objs) -> None:
    for o in objs:
        if hasattr(o, "shutdown"):
            o.shutdown()
    del objs
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def rand_ids(rng: random.Random, n: int) -> list:
    return [rng.randrange(3, TOKENIZER_VOCAB) for _ in range(n)]


def greedy(n: int, **extra) -> dict:
    return {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True, **extra}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def cuda_time(fn, reps: int) -> float:
    """Median seconds of fn() by CUDA events."""
    if not torch.cuda.is_available():
        return statistics.median(wall(fn) for _ in range(reps))
    from cuda_timing import cuda_median_s

    return cuda_median_s(fn, reps)


def wall(fn) -> float:
    sync()
    t = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t


def weight_bytes(model) -> tuple[int, int]:
    """(all parameter bytes, bytes a decode step reads: all but an untied embedding, of which a step
    reads one row per token). Quantized weights count at their stored size, their scales included."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb = model.embed_tokens.weight
    tied = model.lm_head is None
    return total, total - (0 if tied else emb.numel() * emb.element_size())


def kv_bytes_per_token(runner) -> int:
    """KV-cache bytes one cached token costs a decode step to read (every layer's K and V)."""
    pool = runner.kv_pool
    return sum(t[0].numel() * t.element_size() for t in pool.k + pool.v)


def decode_step_read_bytes(runner, mean_context: float) -> float:
    """Bytes one batch-1 decode step must read: the weights it uses and the KV of `mean_context` tokens."""
    return weight_bytes(runner.model)[1] + mean_context * kv_bytes_per_token(runner)


def prefill_flops(model, n: int, length: int) -> float:
    """FLOPs of n fresh prompts of `length` tokens as computed: every token through every layer's
    linears and causal attention, the output head for each prompt's last token only."""
    s = model.shape
    layer_params = sum(p.numel() for name, p in model.layers.named_parameters() if p.dim() == 2)
    head = s.vocab_size * s.hidden
    attention = 4 * s.num_layers * s.num_heads * s.head_dim * length * (length + 1) / 2  # QK^T and PV, per prompt
    return n * (2 * length * layer_params + 2 * head + attention)


def decode_rate(eng, prompt: list, n: int, reps: int = 2, **sampling) -> float:
    """Decode tokens/s of one request: (n - 1) / (time(n tokens) - time(1 token)); greedy unless
    `sampling` says otherwise."""
    run = lambda k: wall(lambda: eng.generate(input_ids=[prompt], sampling_params=greedy(k, **sampling)))  # noqa: E731
    run(8)
    t1 = min(run(1) for _ in range(3))
    tn = min(run(n) for _ in range(reps))
    return (n - 1) / (tn - t1)


def recaptured_rates(eng, prompt: list, suffix: str, layers=None, **changes) -> dict:
    """The same engine with its kernel settings changed by `changes` (a batch-1 graph captured under
    them, and inside the context manager `layers` when given), in the same run: decode tok/s, replay
    ms, and the largest logit difference from the engine's own graph on the same inputs (the last
    step's). The settings and graphs before are restored after."""
    runner, g = eng.runner, eng.runner.graph_runner
    before = runner.settings
    try:
        with layers or contextlib.nullcontext():
            return _alt_graph_rates(eng, prompt, suffix, g, dataclasses.replace(before, **changes))
    finally:
        runner.set_kernel_settings(before)


def _alt_graph_rates(eng, prompt: list, suffix: str, g, settings) -> dict:
    runner = eng.runner
    runner.set_kernel_settings(settings, graph_max_bs=1)
    alt = runner.graph_runner
    out = {f"graph_tok_s_{suffix}": decode_rate(eng, prompt, SZ["bs1_out"]),
           f"replay_step_ms_{suffix}": cuda_time(lambda: alt.graphs[1].replay(), 50) * 1e3}
    logits = []
    for r in (g, alt):
        for buf in ("input_ids", "positions", "out_cache_loc", "req_pool_indices", "seq_lens"):
            getattr(r, buf)[:1].copy_(getattr(alt, buf)[:1])
        r.graphs[1].replay()
        logits.append(r.logits[1].clone())
    out[f"logits_maxdiff_{suffix}"] = float((logits[0] - logits[1]).abs().max())
    return out


def flash_prefill_on(eng) -> bool:
    """Whether the engine's attention backend runs prompt-only prefill rows through torch's flash kernel."""
    return bool(getattr(eng.runner.backend, "flash_enabled", lambda: False)())


def set_extend_settings(runner, settings) -> None:
    """Switch a running engine to `settings` that differ only in what extend passes do (flash_prefill): no
    CUDA graph takes the flash path (the extend graphs always run the Triton kernel), so the graphs are kept
    (runner.set_kernel_settings would capture them again)."""
    runner.settings = runner.backend.settings = settings
