"""Batch-1 decode with the GEMV prologues (kernels/gemv_fused.py: RMSNorm into qkv / gate_up, SiLU-and-mul
into down) against the same engine without them, and the GEMV-only bound: what sec_bs1 adds (issue 28)."""

from __future__ import annotations

import dataclasses

import torch

from gpubench.common import DEV, OPTS, SZ, cuda_time, decode_rate, greedy
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


def _arm(eng, prompt: list, settings, name: str) -> dict:
    runner = eng.runner
    runner.set_kernel_settings(settings, graph_max_bs=1)
    g = runner.graph_runner
    out = {f"tok_s_{name}": decode_rate(eng, prompt, SZ["bs1_out"], reps=2)}
    if g is not None:
        out[f"replay_step_ms_{name}"] = cuda_time(lambda: g.graphs[1].replay(), 50) * 1e3
    return out


def _last_logits(runner, like) -> torch.Tensor:
    """The batch-1 graph's logits for `like`'s last inputs (the same step in both arms)."""
    g = runner.graph_runner
    for buf in ("input_ids", "positions", "out_cache_loc", "req_pool_indices", "seq_lens"):
        getattr(g, buf)[:1].copy_(like[buf])
    g.graphs[1].replay()
    return g.logits[1].clone()


def prologue_ab(eng, prompt: list, rounds: int = 2) -> dict:
    """Fused (the default) and unfused, interleaved `rounds` times in this engine, batch-1 graphs recaptured per
    arm; the logits of one step under each; a profile of each arm's replay; the GEMV-only bound. The engine's
    settings and graphs are restored after."""
    runner = eng.runner
    before = runner.settings
    graph_bs = runner.graph_runner.max_bs if runner.graph_runner is not None else None
    arms = {"fused": dataclasses.replace(before, gemv_prologue=True),
            "unfused": dataclasses.replace(before, gemv_prologue=False)}
    out: dict = {}
    try:
        for r in range(rounds):
            for name, settings in arms.items():
                for key, v in _arm(eng, prompt, settings, name).items():
                    out.setdefault(key, []).append(v)
        like = None
        logits = {}
        for name, settings in arms.items() if DEV == "cuda" else ():
            runner.set_kernel_settings(settings, graph_max_bs=1)
            g = runner.graph_runner
            if like is None:  # a real step's inputs in the graph's buffers, then the same inputs for both arms
                eng.generate(input_ids=[prompt], sampling_params=greedy(8))
            like = like or {b: getattr(g, b)[:1].clone() for b in ("input_ids", "positions", "out_cache_loc",
                                                                   "req_pool_indices", "seq_lens")}
            logits[name] = _last_logits(runner, like)
            key = OPTS.section_key
            OPTS.section_key = f"{key}_{name}"
            try:
                out[f"top_kernels_us_per_step_{name}"] = profile_replay(runner)
            finally:
                OPTS.section_key = key
        if logits:
            out["logits_maxdiff_fused_vs_unfused"] = float((logits["fused"] - logits["unfused"]).abs().max())
            out["same_argmax"] = bool(logits["fused"].argmax() == logits["unfused"].argmax())
        out["gemv_only_ms"] = gemv_only_ms(runner)
    finally:
        runner.set_kernel_settings(before, graph_max_bs=graph_bs)
    for name in arms:
        tok = out[f"tok_s_{name}"]
        out[f"tok_s_{name}_best"] = max(tok)
        out[f"replay_step_ms_{name}_best"] = min(out.get(f"replay_step_ms_{name}", [float("nan")]))
        out[f"pct_of_gemv_bound_{name}"] = 100 * max(tok) * out["gemv_only_ms"] / 1e3
    out["fused_over_unfused"] = out["tok_s_fused_best"] / out["tok_s_unfused_best"]
    return out
