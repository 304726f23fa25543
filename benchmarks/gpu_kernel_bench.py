"""Decode-step kernels at Llama-3-8B shapes on one GPU (CUDA only, ~30-60 s):

    python3 benchmarks/gpu_kernel_bench.py --out $OUT/kern

- gemv: each linear layer at M=1, cuBLAS (F.linear) vs the Triton GEMV (kernels/gemv.py), in us
  and TB/s of weight traffic, plus a sweep of GEMV launch configs and what `choose_gemv` (the
  model's load-time chooser) picks for M = 1, 2, 4, 8. Each layer cycles over enough weight
  copies to exceed the L2 cache, as the 32 layers of a decode step do.
- rotary_kv: rotary + KV store as two kernels vs the fused kernel, T = 1 and 64 tokens.
- layer_chain: a batch-1 decode step minus attention: GEMV with PDL off, on with the trigger after
  the wait (late) and before it (early, the default), and cuBLAS.
Every kernel is checked against its torch reference first. Times are per call inside a CUDA
graph (as a decode step replays one). Writes DIR/kernel_bench.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from radixflow.kernels import reference as ref  # noqa: E402
from radixflow.kernels.gemv import GEMV_CONFIG, GEMV_CONFIGS, choose_gemv, gemv, time_graph_us  # noqa: E402
from radixflow.kernels.kv_store import store_kv  # noqa: E402
from radixflow.kernels.rotary import apply_rotary, apply_rotary_store_kv  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, LAYERS = 4096, 32, 8, 128, 14336, 128256, 32
# name: (N, K, calls per decode step)
SHAPES = {
    "qkv": ((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN, LAYERS),
    "o": (HIDDEN, HEADS * HEAD_DIM, LAYERS),
    "gate_up": (2 * INTER, HIDDEN, LAYERS),
    "down": (HIDDEN, INTER, LAYERS),
    "lm_head": (VOCAB, HIDDEN, 1),
}
# (block_n, block_k, num_warps, stages) timed beyond the chooser's GEMV_CONFIGS (all timed, GEMV_CONFIG as "default")
SWEEP = [
    (8, 512, 4, 4),
    (16, 256, 4, 4),
    (8, 1024, 8, 3),
]
L2_BYTES = 256 << 20  # well past the H200's 50 MB L2
DTYPE = torch.bfloat16
DEV = "cuda"


def _cfg(c: tuple) -> dict:
    return dict(zip(("block_n", "block_k", "num_warps", "stages"), c))


def _name(cfg: dict) -> str:
    return f"n{cfg['block_n']}_k{cfg['block_k']}_w{cfg['num_warps']}_s{cfg['stages']}"


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def bench_gemv(n: int, k: int) -> dict:
    w_bytes = n * k * DTYPE.itemsize
    copies = max(1, -(-L2_BYTES // w_bytes))
    weights = [(torch.randn(n, k, device=DEV) * k**-0.5).to(DTYPE) for _ in range(copies)]
    calls = max(copies, 8)
    res: dict = {"copies": copies, "errors": {}}
    for m in (1, 8):
        x = torch.randn(m, k, device=DEV, dtype=DTYPE)
        res["errors"][f"M{m}_vs_ref"] = _max_err(gemv(x, weights[0]), ref.gemv_ref(x, weights[0]))
    x = torch.randn(1, k, device=DEV, dtype=DTYPE)
    tbs = lambda us: (w_bytes + (k + n) * DTYPE.itemsize) / us / 1e6  # noqa: E731
    blas = time_graph_us(lambda i: F.linear(x, weights[i % copies]), calls)
    res["cublas_us"], res["cublas_tbs"] = blas, tbs(blas)
    res["sweep_us"] = {}
    for cfg in list(GEMV_CONFIGS) + [_cfg(c) for c in SWEEP]:
        label = "default" if cfg is GEMV_CONFIG else _name(cfg)
        try:
            res["sweep_us"][label] = time_graph_us(lambda i: gemv(x, weights[i % copies], config=cfg), calls)
            res.setdefault("sweep_err", {})[label] = _max_err(gemv(x, weights[0], config=cfg), ref.gemv_ref(x, weights[0]))
            res.setdefault("sweep_cfg", {})[label] = cfg
        except Exception as e:  # a config the compiler or the GPU rejects: report it, keep sweeping
            res.setdefault("sweep_failed", {})[label] = repr(e)[:300]
    res["triton_us"] = res["sweep_us"]["default"]
    res["triton_tbs"] = tbs(res["triton_us"])
    best = min(res["sweep_us"], key=res["sweep_us"].get)
    res["best_config"], res["best_us"], res["best_tbs"] = best, res["sweep_us"][best], tbs(res["sweep_us"][best])
    max_m, config, timings = choose_gemv([(w, None) for w in weights])
    res["chooser"] = {"gemv_max_m": max_m, "config": config, "us_by_m": {m: {"cublas": b, "triton": t} for m, (b, t) in timings.items()}}
    return res


def _split(qkv: torch.Tensor) -> list[torch.Tensor]:
    """q, k, v views [T, H, D] of a fused qkv projection output."""
    sizes = [HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM]
    return [x.view(qkv.shape[0], -1, HEAD_DIM) for x in qkv.split(sizes, dim=-1)]


def bench_rotary_kv(t: int) -> dict:
    cos, sin = ref_tables(8192)
    slots = 65536
    qkv = torch.randn(t, (HEADS + 2 * KV_HEADS) * HEAD_DIM, device=DEV, dtype=DTYPE)
    q, k, v = _split(qkv)
    k_buf = torch.zeros(slots, KV_HEADS, HEAD_DIM, device=DEV, dtype=DTYPE)
    v_buf = torch.zeros_like(k_buf)
    pos = torch.randint(0, 8192, (t,), device=DEV)
    loc = torch.randperm(slots, device=DEV)[:t]
    # correctness: fused vs reference, and bit for bit vs the two separate kernels
    want = [x.clone() for x in (qkv, k_buf, v_buf)]
    ref.rotary_store_kv_ref(pos, *_split(want[0]), cos, sin, want[1], want[2], loc)
    sep = [x.clone() for x in (qkv, k_buf, v_buf)]
    sq, sk, sv = _split(sep[0])
    apply_rotary(pos, sq, sk, cos, sin)
    store_kv(sep[1], sep[2], loc, sk, sv)
    apply_rotary_store_kv(pos, q, k, v, cos, sin, k_buf, v_buf, loc)
    got = (qkv, k_buf, v_buf)
    res = {
        "max_err_vs_ref": max(_max_err(a, b) for a, b in zip(got, want)),
        "equal_to_separate": all(torch.equal(a, b) for a, b in zip(got, sep)),
    }

    def separate(i: int) -> None:
        apply_rotary(pos, q, k, cos, sin)
        store_kv(k_buf, v_buf, loc, k, v)

    res["separate_us"] = time_graph_us(separate, LAYERS)
    res["fused_us"] = time_graph_us(lambda i: apply_rotary_store_kv(pos, q, k, v, cos, sin, k_buf, v_buf, loc), LAYERS)
    return res


def bench_layer_chain(chosen: dict, swept: dict | None = None) -> dict:
    """A batch-1 decode step without attention: per layer RMSNorm, qkv GEMV, rotary + KV store,
    o GEMV, RMSNorm, gate_up GEMV, SiLU-and-mul, down GEMV; 32 layers over 8 weight copies (well
    past L2). Variants: every matmul by the GEMV with PDL on / off (kernels/pdl.py), the same with
    each shape's config as chosen by `choose_gemv` (`chosen`: shape name -> config), and every
    matmul by cuBLAS. us per step, and TB/s of weight bytes."""
    from radixflow.kernels.norm_act import rmsnorm, silu_and_mul
    from radixflow.kernels.settings import KernelSettings

    copies = 8
    mk = lambda n, k: (torch.randn(n, k, device=DEV) * k**-0.5).to(DTYPE)  # noqa: E731
    layers = [{name: mk(n, k) for name, (n, k, _) in SHAPES.items() if name != "lm_head"} for _ in range(copies)]
    norm_w = torch.ones(HIDDEN, device=DEV, dtype=DTYPE)
    cos, sin = ref_tables(8192)
    k_buf = torch.zeros(4096, KV_HEADS, HEAD_DIM, device=DEV, dtype=DTYPE)
    v_buf = torch.zeros_like(k_buf)
    pos, loc = torch.tensor([300], device=DEV), torch.tensor([17], device=DEV)
    x0, r0 = (torch.randn(1, HIDDEN, device=DEV, dtype=DTYPE) for _ in range(2))
    step_bytes = sum(w.numel() * DTYPE.itemsize for w in layers[0].values()) * LAYERS

    def step(mm, s: KernelSettings):
        x, r = x0, r0
        for i in range(LAYERS):
            w = layers[i % copies]
            h, r = rmsnorm(x, norm_w, 1e-5, r, settings=s)
            q, k, v = _split(mm(h, w, "qkv", s))
            apply_rotary_store_kv(pos, q, k, v, cos, sin, k_buf, v_buf, loc, settings=s)
            h, r = rmsnorm(mm(q.reshape(1, -1), w, "o", s), norm_w, 1e-5, r, settings=s)
            x = mm(silu_and_mul(mm(h, w, "gate_up", s), s), w, "down", s)
        return x

    res, outs = {}, {}
    blas = lambda x, w, name, s: F.linear(x, w[name])  # noqa: E731
    default = lambda x, w, name, s: gemv(x, w[name], settings=s)  # noqa: E731
    best = lambda x, w, name, s: gemv(x, w[name], config=chosen.get(name), settings=s)  # noqa: E731  (--shapes: others default)
    swept_best = lambda x, w, name, s: gemv(x, w[name], config=(swept or {}).get(name), settings=s)  # noqa: E731
    variants = {"cublas": (blas, False, False), "gemv_pdl_off": (default, False, False),
                "gemv_pdl_late": (default, True, False), "gemv_pdl_on": (default, True, True),
                "gemv_chosen_pdl_late": (best, True, False), "gemv_chosen_pdl_on": (best, True, True),
                "gemv_sweep_best_pdl_on": (swept_best, True, True)}
    for name, (mm, on, early) in variants.items():
        s = KernelSettings(pdl=on, pdl_early_trigger=early)
        outs[name] = step(mm, s)
        us = time_graph_us(lambda i, mm=mm, s=s: step(mm, s), 1, reps=10)
        res[name] = {"us": us, "weight_tbs": step_bytes / us / 1e6}
    gemv_outs = [o for n, o in outs.items() if n.startswith("gemv_pdl")]  # the default config: PDL off / late / early
    res["gemv_variants_equal"] = all(torch.equal(gemv_outs[0], o) for o in gemv_outs[1:])
    res["max_err_vs_cublas"] = _max_err(gemv_outs[0], outs["cublas"])
    return res


def ref_tables(max_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (500000.0 ** (torch.arange(0, HEAD_DIM, 2, device=DEV).float() / HEAD_DIM))
    emb = torch.outer(torch.arange(max_pos, device=DEV).float(), inv).repeat(1, 2)
    return emb.cos(), emb.sin()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for kernel_bench.json")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset of " + ",".join(SHAPES))
    opts = ap.parse_args()
    assert torch.cuda.is_available(), "CUDA only"
    os.makedirs(opts.out, exist_ok=True)
    import triton

    results: dict = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "gemv_config": GEMV_CONFIG, "gemv": {}, "rotary_kv": {},
    }
    for name in opts.shapes.split(","):
        n, k, per_step = SHAPES[name]
        results["gemv"][name] = r = bench_gemv(n, k)
        r.update(n=n, k=k, per_step=per_step)
        torch.cuda.empty_cache()
        print(f"{name} done", flush=True)
    for t in (1, 64):
        results["rotary_kv"][f"T{t}"] = bench_rotary_kv(t)
    results["layer_chain"] = bench_layer_chain({name: r["chooser"]["config"] for name, r in results["gemv"].items()},
                                               {name: r["sweep_cfg"].get(r["best_config"]) for name, r in results["gemv"].items()})
    ok = set.intersection(*(set(r["sweep_us"]) for r in results["gemv"].values()))
    per_cfg = {c: sum(r["sweep_us"][c] * r["per_step"] for r in results["gemv"].values()) for c in ok}
    results["step_us_by_config"] = per_cfg
    results["step_us_cublas"] = sum(r["cublas_us"] * r["per_step"] for r in results["gemv"].values())
    with open(os.path.join(opts.out, "kernel_bench.json"), "w") as f:
        json.dump(results, f, indent=1)
    print_table(results)


def print_table(res: dict) -> None:
    print(f"\n{res['gpu']}  torch {res['torch']}  triton {res['triton']}  GEMV_CONFIG {res['gemv_config']}")
    print(f"{'M=1':8} {'N x K':>13} {'cuBLAS us':>10} {'TB/s':>5} {'triton us':>10} {'TB/s':>5} "
          f"{'best cfg':>20} {'us':>7} {'TB/s':>5} {'chooser':>22} {'err M1/M8':>12}")
    for name, r in res["gemv"].items():
        chosen = f"M<={r['chooser']['gemv_max_m']} {_name(r['chooser']['config'])}" if r["chooser"]["gemv_max_m"] else "cuBLAS"
        errs = "/".join(f"{e:.3f}" for e in r["errors"].values())
        print(f"{name:8} {r['n']:>6}x{r['k']:<6} {r['cublas_us']:10.1f} {r['cublas_tbs']:5.2f} {r['triton_us']:10.1f} "
              f"{r['triton_tbs']:5.2f} {r['best_config']:>20} {r['best_us']:7.1f} {r['best_tbs']:5.2f} {chosen:>22} {errs:>12}")
    print("decode-step matmul us (x per-step calls): cuBLAS %.0f | " % res["step_us_cublas"]
          + " | ".join(f"{c} {us:.0f}" for c, us in sorted(res["step_us_by_config"].items(), key=lambda kv: kv[1])))
    chain = res["layer_chain"]
    print("decode step without attention (us, weight TB/s): " + " | ".join(
        f"{n} {r['us']:.0f} {r['weight_tbs']:.2f}" for n, r in chain.items() if isinstance(r, dict))
        + f"; GEMV variants equal: {chain['gemv_variants_equal']}, max err vs cuBLAS {chain['max_err_vs_cublas']:.3f}")
    for t, r in res["rotary_kv"].items():
        print(f"rotary+store {t}: separate {r['separate_us']:.2f} us, fused {r['fused_us']:.2f} us per layer; "
              f"max err vs ref {r['max_err_vs_ref']:.3f}, equal to separate kernels: {r['equal_to_separate']}")


if __name__ == "__main__":
    main()
