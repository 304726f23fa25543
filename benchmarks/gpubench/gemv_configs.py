"""Sections gemv_configs, gemv_config_search: the GEMV chooser's per-shape configs against fixed ones."""

from __future__ import annotations

import contextlib
import gc
import random
import statistics

from gpubench.common import OPTS, SZ, cuda_time, decode_rate, rand_ids, recaptured_rates


def _gemv_layers(model) -> list:
    """The model's linear layers that run small batches through the Triton GEMV."""
    from radixflow.runtime.execution.layers.parallel_linear import SmallBatchMatmul

    return [m for m in model.modules() if isinstance(m, SmallBatchMatmul) and m.gemv_max_m]


def gemv_configs_in_use(model) -> list:
    """'(N, K): config' for each GEMV weight shape, as the model's layers now hold them."""
    return sorted({f"{tuple(m.weight.shape)}: {m.gemv_config}" for m in _gemv_layers(model)})


@contextlib.contextmanager
def _forced_config(layers: list, config: dict):
    """Every GEMV layer in `layers` on `config` inside the block; each its own config after."""
    saved = [m.gemv_config for m in layers]
    for m in layers:
        m.gemv_config = config
    try:
        yield
    finally:
        for m, c in zip(layers, saved):
            m.gemv_config = c


def _forced_config_rates(eng, prompt: list, index: int) -> dict:
    """A batch-1 graph with every GEMV on GEMV_CONFIGS[index], not the chooser's config for its shape."""
    from radixflow.kernels.gemv import GEMV_CONFIGS

    out = recaptured_rates(eng, prompt, f"cfg{index}", _forced_config(_gemv_layers(eng.runner.model), GEMV_CONFIGS[index]))
    out["chosen_configs"] = gemv_configs_in_use(eng.runner.model)
    return out


def sec_gemv_configs() -> dict:
    """Batch-1 decode with the chooser's per-shape GEMV configs against every GEMV on one config
    (GEMV_CONFIGS[1], then [2]), interleaved, twice."""
    eng, out = OPTS.bench_engine, {}
    if eng.runner.graph_runner is None:
        return {"skipped": "no CUDA graphs"}
    prompt = rand_ids(random.Random(7), 128)
    for rep in range(2):
        out[f"chosen_tok_s#{rep}"] = decode_rate(eng, prompt, SZ["bs1_out"])
        for i in (1, 2):
            out.update({f"{k}#{rep}": v for k, v in _forced_config_rates(eng, prompt, i).items()})
    return out


EXTRA_GEMV_CONFIGS = (
    {"block_n": 4, "block_k": 2048, "num_warps": 8, "stages": 3},
    {"block_n": 2, "block_k": 1024, "num_warps": 4, "stages": 4},
    {"block_n": 8, "block_k": 1024, "num_warps": 8, "stages": 3},
    {"block_n": 4, "block_k": 512, "num_warps": 4, "stages": 4},
)


def sec_gemv_config_search() -> dict:
    """Coordinate descent over the GEMV config of each weight shape (GEMV_CONFIGS and a few more),
    scored by the replay time of a freshly captured batch-1 graph; then the best mix against the
    chooser's, interleaved. Says whether tuning on whole steps would beat the per-shape chooser."""
    from radixflow.kernels.gemv import GEMV_CONFIGS
    from radixflow.runtime.execution.cuda_graph_runner import CudaGraphRunner

    eng = OPTS.bench_engine
    runner, g = eng.runner, eng.runner.graph_runner
    if g is None:
        return {"skipped": "no CUDA graphs"}
    mms = _gemv_layers(runner.model)
    shapes = sorted({tuple(m.weight.shape) for m in mms})
    chosen = {tuple(m.weight.shape): m.gemv_config for m in mms}
    configs = list(GEMV_CONFIGS) + list(EXTRA_GEMV_CONFIGS)

    def step_ms(mix: dict) -> float:
        for m in mms:
            m.gemv_config = mix[tuple(m.weight.shape)]
        graph = CudaGraphRunner(runner.model, runner.backend, 1).graphs[1]
        ms = cuda_time(graph.replay, 30) * 1e3
        gc.collect()  # the previous trial's graph and its memory pool
        return ms

    best, best_ms, trace = dict(chosen), step_ms(chosen), []
    try:
        for sweep in range(2):
            for shape in shapes:
                for cfg in configs:
                    if cfg == best[shape]:
                        continue
                    trial = {**best, shape: cfg}
                    ms = step_ms(trial)
                    trace.append((sweep, str(shape), str(cfg), round(ms, 4)))
                    if ms < best_ms * 0.997:  # beats the current mix by more than noise
                        best, best_ms = trial, ms
        final = {"chosen": [], "best": []}
        for _ in range(5):  # interleaved
            final["chosen"].append(step_ms(chosen))
            final["best"].append(step_ms(best))
    finally:
        for m in mms:
            m.gemv_config = chosen[tuple(m.weight.shape)]
    return {"chosen": {str(k): v for k, v in chosen.items()}, "best": {str(k): v for k, v in best.items()},
            "chosen_ms_median": statistics.median(final["chosen"]), "best_ms_median": statistics.median(final["best"]),
            "final": final, "trace": trace}
