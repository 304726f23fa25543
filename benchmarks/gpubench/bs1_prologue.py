"""Batch-1 decode with the GEMV prologues (kernels/gemv_fused.py: RMSNorm into qkv / gate_up, SiLU-and-mul
into down; --enable-gemv-prologue) against the same engine without them (the default), and the GEMV-only
bound: what sec_bs1 adds (issue 28)."""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from gpubench.common import DEV, SZ, cuda_time, decode_rate, greedy
from gpubench.decode_profile import profile_replay


def gemv_only_ms(runner) -> float:
    """GPU ms of one decode step's matmuls alone at batch 1: every linear layer through its own path (the GEMV
    and its chosen config where chosen, PDL as the settings say) and the output head, back to back in a CUDA
    graph. No decode step can beat this without faster GEMVs; the step's other kernels come on top."""
    from radixflow.kernels.gemv import capture_graph, replay_us
    from radixflow.runtime.execution.layers.parallel_linear import ColumnParallelLinear, RowParallelLinear

    model = runner.model
    linears = [m for m in model.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    dtype = next(p.dtype for p in model.parameters() if p.dtype in (torch.bfloat16, torch.float16, torch.float32))
    inputs = {k: torch.randn(1, k, device=DEV).to(dtype) for k in {m.weight.shape[1] for m in linears}}
    hidden = inputs[model.shape.hidden] if model.shape.hidden in inputs else torch.randn(1, model.shape.hidden, device=DEV).to(dtype)

    def step(_: int) -> None:
        for m in linears:
            m(inputs[m.weight.shape[1]])
        model.compute_logits(hidden)

    if DEV != "cuda":  # the smoke run: the plumbing only
        step(0)
        return float("nan")
    graph = capture_graph(step, 1)
    return min(replay_us(graph, 1, reps=20) for _ in range(3)) / 1e3


def prologue_choices(model) -> dict:
    """Per fusable layer shape: the fused config the load-time chooser kept (None: unfused) and its timings."""
    return {f"{tuple(m.weight.shape)} {m.prologue}": {"config": str(m.prologue_config), "us": m.prologue_timings}
            for m in model.modules() if getattr(m, "prologue", "")}


@contextlib.contextmanager
def _forced(model, on: bool):
    """With `on`, every fusable layer fused at the fused config that timed fastest at load, whether or not
    it beat the two kernels there; restored after."""
    from radixflow.kernels.gemv import GEMV_CONFIGS, GEMV_CONFIGS_FP8

    configs = {str(c): c for c in GEMV_CONFIGS + GEMV_CONFIGS_FP8}
    layers = [m for m in model.modules() if getattr(m, "prologue", "") and m.prologue_timings]
    saved = [m.prologue_config for m in layers]
    try:
        for m in layers if on else ():
            m.prologue_config = configs[min((k for k in m.prologue_timings if k != "unfused"), key=m.prologue_timings.get)]
        yield
    finally:
        for m, c in zip(layers, saved):
            m.prologue_config = c


def _arm(eng, prompt: list, settings, name: str) -> dict:
    runner = eng.runner
    runner.set_kernel_settings(settings, graph_max_bs=1)
    g = runner.graph_runner
    out = {f"tok_s_{name}": decode_rate(eng, prompt, SZ["bs1_out"], reps=2)}
    if g is not None:
        out[f"replay_step_ms_{name}"] = cuda_time(lambda: g.graphs[1].replay(), 50) * 1e3
    return out


GRAPH_INPUTS = ("input_ids", "positions", "out_cache_loc", "req_pool_indices", "seq_lens")


def _logits_and_profile(eng, prompt: list, settings, name: str, like: dict | None) -> tuple:
    """(one batch-1 graph step's logits on `like`'s inputs, those inputs (None: a real step's, for the next
    arm), the top kernels of the replay's profile: forced and unfused arms only, else None)."""
    runner = eng.runner
    runner.set_kernel_settings(settings, graph_max_bs=1)
    g = runner.graph_runner
    if like is None:
        eng.generate(input_ids=[prompt], sampling_params=greedy(8))
        like = {b: getattr(g, b)[:1].clone() for b in GRAPH_INPUTS}
    for b in GRAPH_INPUTS:
        getattr(g, b)[:1].copy_(like[b])
    g.graphs[1].replay()
    logits, profile = g.logits[1].clone(), None
    if name != "chosen":  # into results.json only: a device call brings back at most 8 files
        profile = profile_replay(runner, write=False)
    return logits, like, profile


def prologue_ab(eng, prompt: list, rounds: int = 2) -> dict:
    """Three arms, interleaved `rounds` times in this engine, the batch-1 graph recaptured per arm: chosen
    (--enable-gemv-prologue: each shape fused where its fused kernel timed faster at load, chosen here if the
    engine was built without), forced (every fusable shape fused at its fastest fused config) and unfused (the
    default). Also one step's logits under each, the top kernels of the forced and unfused replays, and the
    GEMV-only bound. The engine's settings and graphs are restored after."""
    from radixflow.runtime.execution.layers.parallel_linear import choose_gemv_prologues

    runner = eng.runner
    before = runner.settings
    fusable = [m for m in runner.model.modules() if getattr(m, "prologue", "")]
    if DEV == "cuda" and not any(m.prologue_timings for m in fusable):
        choose_gemv_prologues(fusable, dataclasses.replace(before, gemv_prologue=True))
    graph_bs = runner.graph_runner.max_bs if runner.graph_runner is not None else None
    on, off = dataclasses.replace(before, gemv_prologue=True), dataclasses.replace(before, gemv_prologue=False)
    arms = {"chosen": (on, False), "forced": (on, True), "unfused": (off, False)}
    out: dict = {"choices": prologue_choices(runner.model)}
    try:
        for _ in range(rounds):
            for name, (settings, force) in arms.items():
                with _forced(runner.model, force):
                    for key, v in _arm(eng, prompt, settings, name).items():
                        out.setdefault(key, []).append(v)
        like, logits = None, {}
        for name, (settings, force) in arms.items() if DEV == "cuda" else ():
            with _forced(runner.model, force):
                logits[name], like, profile = _logits_and_profile(eng, prompt, settings, name, like)
            if profile is not None:
                out[f"top_kernels_us_per_step_{name}"] = profile
        for name in ("chosen", "forced") if logits else ():
            out[f"logits_maxdiff_{name}_vs_unfused"] = float((logits[name] - logits["unfused"]).abs().max())
            out[f"same_argmax_{name}"] = bool(logits[name].argmax() == logits["unfused"].argmax())
        out["gemv_only_ms"] = gemv_only_ms(runner)
    finally:
        runner.set_kernel_settings(before, graph_max_bs=graph_bs)
    for name in arms:
        tok = out[f"tok_s_{name}"]
        out[f"tok_s_{name}_best"] = max(tok)
        out[f"replay_step_ms_{name}_best"] = min(out.get(f"replay_step_ms_{name}", [float("nan")]))
        out[f"pct_of_gemv_bound_{name}"] = 100 * max(tok) * out["gemv_only_ms"] / 1e3
    for name in ("chosen", "forced"):
        out[f"{name}_over_unfused"] = out[f"tok_s_{name}_best"] / out["tok_s_unfused_best"]
    return out
