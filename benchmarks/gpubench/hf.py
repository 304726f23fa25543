"""Sections hf, hf_compile: transformers' generate as the baseline."""

from __future__ import annotations

import random
import time
import traceback

import torch

from gpubench.common import DEV, OPTS, SZ, config_path, free, log, rand_ids, sync, wall
from gpubench.offline import offline_requests


def _hf_model(config: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(config_path(config))
    with torch.device(DEV):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32 if OPTS.smoke else torch.bfloat16)
    return model.eval()


class TokenClock:
    """A transformers streamer that only timestamps each generated step."""

    def __init__(self):
        self.times: list = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass

    def decode_rate(self) -> float:
        """Tokens/s after the first generated token (times[0] is the prompt)."""
        steps = self.times[1:]
        return (len(steps) - 1) / (steps[-1] - steps[0])


def _hf_generate(model, ids: torch.Tensor, n: int, mask=None, clock=None) -> float:
    """Seconds for n new tokens (EOS suppressed), batch as given."""
    with torch.no_grad():
        return wall(lambda: model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                           do_sample=False, streamer=clock))


def _hf_bs1_rate(model, n: int) -> float:
    ids = torch.tensor([rand_ids(random.Random(7), 128)], device=DEV)
    _hf_generate(model, ids, n)  # warm-up (and, when compiled, compilation)
    clock = TokenClock()
    _hf_generate(model, ids, n, clock=clock)
    return clock.decode_rate()


def sec_hf() -> dict:
    model = _hf_model("llama3-8b")
    out = {"bs1_eager_tok_s": _hf_bs1_rate(model, SZ["hf_bs1_out"])}
    reqs = offline_requests()[:64]
    longest = max(len(p) for p, _ in reqs)
    pad = [[0] * (longest - len(p)) + p for p, _ in reqs]
    mask = [[0] * (longest - len(p)) + [1] * len(p) for p, _ in reqs]
    steps = max(o for _, o in reqs)
    t = _hf_generate(model, torch.tensor(pad, device=DEV), steps, torch.tensor(mask, device=DEV))
    out["bs64_useful_out_tok_s"] = sum(o for _, o in reqs) / t
    out["bs64_all_out_tok_s"] = len(reqs) * steps / t
    out["bs64_s"] = t
    del model
    free()
    return out


def _hf_compiled_generate(model, ids: torch.Tensor, n: int, cache) -> dict:
    """transformers' own recipe: generate() with a static cache compiles its decode step
    (CompileConfig: inductor, mode="reduce-overhead") and runs the prefill eagerly. Our cache
    object is passed in and reset between calls so its tensors keep their addresses (a new
    cache per call would re-record the CUDA graph)."""
    from transformers import CompileConfig

    cc = CompileConfig(fullgraph=True, mode="reduce-overhead")
    cc._compile_all_devices = DEV == "cpu"  # generate() compiles on CPU only when told to (smoke)

    def run(k: int, clock=None):
        cache.reset()
        with torch.no_grad():
            return model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, compile_config=cc,
                                  max_new_tokens=k, min_new_tokens=k, do_sample=False, streamer=clock)

    warm = wall(lambda: run(8))  # compiles, then records the CUDA graph
    clock = TokenClock()
    tokens = run(n, clock)[0, ids.shape[1]:]
    return {"warmup_s": warm, "tok_s": clock.decode_rate(), "tokens": tokens.tolist()}


def _hf_compiled_loop(model, ids: torch.Tensor, n: int, cache) -> dict:
    """A greedy loop of our own over the static cache: the prefill eager (the cache's first
    write must not happen inside a CUDA graph's memory pool, which is what broke compiling
    model.forward whole), the decode step (forward + argmax) compiled with
    mode="reduce-overhead", fullgraph=True; cudagraph_mark_step_begin() before each step and
    the next token cloned out of the graph's output."""

    def step(tok, pos):
        logits = model(input_ids=tok, position_ids=pos, past_key_values=cache, use_cache=True).logits
        return logits[:, -1].argmax(-1, keepdim=True)

    step_c = torch.compile(step, mode="reduce-overhead", fullgraph=True)

    def run(k: int) -> tuple[list, float]:
        """(tokens, decode tok/s after the first token)"""
        cache.reset()
        with torch.no_grad():
            tok = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
            pos, out = torch.full((1, 1), ids.shape[1], device=DEV), [tok]
            sync()
            t = time.perf_counter()
            for _ in range(k - 1):
                torch.compiler.cudagraph_mark_step_begin()
                out.append(step_c(out[-1], pos).clone())
                pos += 1
            sync()
            return torch.cat(out, 1)[0].tolist(), (k - 1) / (time.perf_counter() - t)

    warm = wall(lambda: run(8))
    tokens, rate = run(n)
    return {"warmup_s": warm, "tok_s": rate, "tokens": tokens}


HF_COMPILE = {"generate": _hf_compiled_generate, "loop": _hf_compiled_loop}


def sec_hf_compile() -> dict:
    """transformers batch 1, static cache + torch.compile(mode='reduce-overhead'): each approach of
    --hf-compile in turn until one runs. warmup_s (compilation and graph recording) is one
    8-token call; tok_s is the rate after the first token, like sec_hf (generate: per-token
    timestamps, one host sync per token; loop: no sync until the end)."""
    from transformers import StaticCache

    model = _hf_model("llama3-8b")
    n = SZ["hf_compile_out"]
    ids = torch.tensor([rand_ids(random.Random(7), 128)], device=DEV)
    with torch.no_grad():  # eager greedy tokens, to check the compiled ones against
        eager = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, ids.shape[1]:].tolist()
    out = {"new_tokens": n, "approach": None, "failed": {}}
    for name in OPTS.hf_compile.split(","):
        torch._dynamo.reset()
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        cache = StaticCache(config=model.config, max_cache_len=ids.shape[1] + n + 8)
        t = time.perf_counter()
        try:
            res = HF_COMPILE[name](model, ids, n, cache)
        except Exception as e:  # the next approach runs
            out["failed"][name] = {"error": repr(e)[:800], "after_s": round(time.perf_counter() - t, 1),
                                   "trace": traceback.format_exc()[-1500:]}
            log(f"hf_compile {name} failed after {time.perf_counter() - t:.0f}s: {e!r}"[:600])
            continue
        tokens = res.pop("tokens")
        same = next((i for i, (a, b) in enumerate(zip(tokens, eager)) if a != b), min(len(tokens), len(eager)))
        out.update(approach=name, bs1_compiled_static_tok_s=res["tok_s"], warmup_s=res["warmup_s"],
                   wall_s=time.perf_counter() - t, leading_tokens_equal_to_eager=same,
                   dynamo_graphs=torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs)  # 1: no recompiles
        break
    del model
    free()
    return out
