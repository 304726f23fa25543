"""Section fp8_kernels: the FP8 kernels alone, at Llama-3-8B shapes (CUDA only).

- GEMV at batch 1: every candidate config of the load-time chooser per weight shape and the SWEEP
  configs below, FP8 weights and bf16 weights of the same shape, each call after an RMSNorm in a CUDA graph as the chooser times it;
  TB/s of the weight bytes (the RMSNorm's few microseconds included, so a slight understatement).
- GEMM at decode batches 256 / 544 / 1,024: bf16 F.linear against the FP8 GEMM (per-token quantization,
  then torch._scaled_mm as the engine runs it), and each of its two parts alone (us each; TFLOP/s of the two GEMMs);
  the product's error with exact and with fast accumulation (`_accum_errors`, random operands at these shapes).
  Labels: `scaled_mm_only` / `scaled_mm_padded` accumulate in float32 (the engine's product before session 33,
  the labels kept so runs compare), `scaled_mm_fast_accum` / `scaled_mm_padded_fast` fast (the engine's since).
- GEMM across decode batches 384-1,024 (part gemm_m): the row-wise product alone, with fast accumulation,
  with the operands swapped, and bf16 F.linear: where the row-wise kernel's 128-row tiles cost.
- The activation quantization alone, at both widths and the same M, checked against torch's bits.
- Decode attention at large batches: a bf16 pool through its 4-warp launch (`bf16_4w`, the baseline) and as
  DECODE_CONFIG launches it (`bf16`: 2 warps from batch 256 on an H200 since issue 28), an FP8 pool as
  DECODE_CONFIG launches it (float16 products, V widened in registers, its `fp8` entry), through the 4-warp
  launch with V widened after shared memory, and through bf16 products (DECODE_CONFIG's fp8_f16=False);
  labels as in benchmarks/fp8_attn_bench.py (LAUNCHES), which sweeps the FP8 launches, each with the launch
  it resolved to (`launch`); TB/s of the pool bytes each reads, and each output's largest difference from
  the 4-warp bf16 launch's.
"""

from __future__ import annotations

import math

import torch

from gpubench.common import OPTS, free, log

# Candidates timed beside the chooser's own (GEMV_CONFIGS / GEMV_CONFIGS_FP8), so a run shows which are
# worth a place in the chooser's lists: two tiles per loop step ("unroll") at other shapes, warps and depths.
# No entry repeats one of the chooser's (it would be timed twice).
SWEEP_BF16 = (
    {"block_n": 8, "block_k": 1024, "num_warps": 4, "stages": 3, "unroll": 2},
    {"block_n": 4, "block_k": 2048, "num_warps": 4, "stages": 3, "unroll": 2},
    {"block_n": 8, "block_k": 1024, "num_warps": 4, "stages": 4, "unroll": 2},
    {"block_n": 4, "block_k": 2048, "num_warps": 4, "stages": 4, "unroll": 2},
    {"block_n": 16, "block_k": 1024, "num_warps": 8, "stages": 3, "unroll": 2},
    {"block_n": 8, "block_k": 2048, "num_warps": 8, "stages": 3, "unroll": 2},
)
SWEEP_FP8 = (
    {"block_n": 4, "block_k": 2048, "num_warps": 4, "stages": 6, "unroll": 2},
    {"block_n": 8, "block_k": 2048, "num_warps": 8, "stages": 3, "unroll": 2},
    {"block_n": 16, "block_k": 1024, "num_warps": 8, "stages": 3, "unroll": 2},
    {"block_n": 2, "block_k": 2048, "num_warps": 4, "stages": 4, "unroll": 2},
    {"block_n": 4, "block_k": 1024, "num_warps": 4, "stages": 6, "unroll": 2},
    {"block_n": 4, "block_k": 1024, "num_warps": 4, "stages": 6},
    {"block_n": 4, "block_k": 2048, "num_warps": 4, "stages": 5, "unroll": 2},
    {"block_n": 4, "block_k": 2048, "num_warps": 4, "stages": 3},
    {"block_n": 4, "block_k": 2048, "num_warps": 4, "stages": 4, "unroll": 2},
    {"block_n": 4, "block_k": 4096, "num_warps": 4, "stages": 3, "unroll": 2},
)
GEMV_SHAPES = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
ATTN_CASES = ((256, 1536), (512, 1536))
L2 = 60 << 20


def _gemv_rates(name: str, n: int, k: int) -> dict:
    from radixflow.kernels.gemv import GEMV_CONFIGS, GEMV_CONFIGS_FP8, choose_gemv
    from radixflow.kernels.reference import quantize_rows_torch

    copies = max(2, math.ceil(4 * L2 / (n * k)))  # the FP8 copies hold 4x the L2, as 32 layers would
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    bf16, fp8 = {}, {}
    choose_gemv([(w, None) for w in weights], ms=(1,), report=bf16, configs=GEMV_CONFIGS + SWEEP_BF16)
    quantized = [quantize_rows_torch(w) for w in weights]
    del weights
    choose_gemv([(q, None, s) for q, s in quantized], ms=(1,), report=fp8, configs=GEMV_CONFIGS_FP8 + SWEEP_FP8)

    def rates(times: dict, nbytes: int) -> dict:
        return {c: {"us": round(us, 2), "TBps": round(nbytes / us / 1e6, 3)} for c, us in sorted(times.items(), key=lambda t: t[1])}

    out = {"bf16": rates(bf16, n * k * 2), "fp8": rates(fp8, n * k)}
    best = {kind: {"config": min(v, key=lambda c: v[c]["us"]), **min(v.values(), key=lambda r: r["us"])}
            for kind, v in out.items()}
    out["best"] = best
    log(f"gemv {name} {n}x{k}: bf16 best {best['bf16']}, fp8 best {best['fp8']}")
    return out


GEMM_MS = (256, 544, 1024, 8192)  # decode batches (544: about the offline workload's mean), and a prefill chunk


def _gemm_weights(n: int, k: int) -> tuple[list, list]:
    """bf16 n x k weights and their row-wise FP8 quantizations, in enough copies to outgrow the L2."""
    from radixflow.kernels.reference import quantize_rows_torch

    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(max(2, math.ceil(2 * L2 / (n * k))))]
    return weights, [quantize_rows_torch(w) for w in weights]


def _scaled_mm(xq, xs, wq, ws, fast: bool = False) -> torch.Tensor:
    """The FP8 linear's product: row-wise scales, bf16 out (x @ w.T)."""
    return torch._scaled_mm(xq, wq.t(), scale_a=xs.view(-1, 1), scale_b=ws.view(1, -1), out_dtype=torch.bfloat16,
                            use_fast_accum=fast)


def _time_variants(variants: dict, copies: int) -> dict:
    """{label: us per call in a CUDA graph, calls rotating over `copies` weights}; a variant torch refuses
    (each is called once outside the capture first) holds the error's repr instead."""
    from radixflow.kernels.gemv import time_graph_us

    row: dict = {}
    for label, fn in variants.items():
        try:
            fn(0)
        except Exception as e:  # noqa: BLE001 - recorded, the other variants still timed
            row[label] = repr(e)[:200]
            continue
        row[label] = round(time_graph_us(fn, max(copies, 8)), 2)
    return row


def _add_tflops(row: dict, flops: float, labels: tuple) -> None:
    """row[label + "_TFLOPs"] for each label timed (a failed one holds its error, not a float)."""
    for label in labels:
        if isinstance(row.get(label), float):
            row[f"{label}_TFLOPs"] = round(flops / row[label] / 1e6, 1)


def _gemm_rates(name: str, n: int, k: int) -> dict:
    """At each M of GEMM_MS: bf16 F.linear against the FP8 GEMM (per-token quantization, then
    torch._scaled_mm) and its two parts alone; weights rotate over copies that outgrow the L2."""
    import torch.nn.functional as F

    from radixflow.kernels.fp8 import fp8_gemm, quantize_rows

    weights, quantized = _gemm_weights(n, k)
    copies = len(weights)
    out, one = {}, torch.ones((), device="cuda")
    for m in GEMM_MS:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        xq, xs = quantize_rows(x)
        row = _time_variants({
            "bf16_linear": lambda i: F.linear(x, weights[i % copies]),
            "fp8_gemm": lambda i: fp8_gemm(x, quantized[i % copies][0], None, quantized[i % copies][1]),
            "scaled_mm_only": lambda i: _scaled_mm(xq, xs, *quantized[i % copies]),
            "quantize_only": lambda i: quantize_rows(x),
            # the same product with fast accumulation, and with one scale per tensor: is row-wise the slow part?
            "scaled_mm_fast_accum": lambda i: _scaled_mm(xq, xs, *quantized[i % copies], fast=True),
            "scaled_mm_tensorwise": lambda i: torch._scaled_mm(xq, quantized[i % copies][0].t(), scale_a=one, scale_b=one,
                                                               out_dtype=torch.bfloat16),
        }, copies)
        row["quantize_matches_torch"] = _quantize_matches_torch(x)
        row.update(_accum_errors(x, weights[0], xq, xs, *quantized[0]))
        _add_tflops(row, 2 * m * n * k, ("fp8_gemm", "bf16_linear"))
        out[f"m{m}"] = row
    log(f"gemm {name} {n}x{k}: {out}")
    return out


def _accum_errors(x, w, xq, xs, wq, ws) -> dict:
    """Relative (Frobenius) errors of the row-wise product with exact and with fast accumulation against the same
    quantized operands multiplied in float64, beside the yardsticks: that float64 product rounded once to bf16, and
    the quantization's own error (the float64 product of the quantized operands against that of x and w)."""
    ref = (xq.double() * xs.double()[:, None]) @ (wq.double() * ws.double()[:, None]).t()
    rel = lambda a, b: round(((a.double() - b).norm() / b.norm()).item(), 7)  # noqa: E731
    errors = {"exact_accum_rel_err": rel(_scaled_mm(xq, xs, wq, ws), ref),
              "fast_accum_rel_err": rel(_scaled_mm(xq, xs, wq, ws, fast=True), ref),
              "bf16_rounding_rel_err": rel(ref.to(torch.bfloat16), ref),
              "quantization_rel_err": rel(ref, x.double() @ w.double().t())}
    del ref
    return errors


def fp8_pool(x: dict) -> tuple:
    """The bench inputs' bf16 K / V as an FP8 pool with one scale per KV head (amax / 448)."""
    from radixflow.kernels.reference import FP8, FP8_MAX

    scales = [t.float().abs().amax(dim=(0, 2)) / FP8_MAX for t in (x["k"], x["v"])]
    return [(t.float() / s[None, :, None]).to(FP8) for t, s in zip((x["k"], x["v"]), scales)], tuple(scales)


def _attention_rates(bs: int, length: int) -> dict:
    import fp8_attn_bench as fab
    import gpu_attn_bench as attn
    from radixflow.kernels.decode_attention import decode_attention, num_kv_splits
    from radixflow.kernels.gemv import time_graph_us

    lens = [length] * bs
    x = attn.make_inputs(lens)
    (k8, v8), scales = fp8_pool(x)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    nbytes = attn.kv_bytes(lens)
    launches = {lab: fab.LAUNCHES[lab] for lab in ("bf16_4w", "bf16", "fp8_default", "fp8_bf16_launch")}
    launches["fp8_bf16_products"] = (True, {**fab.FP8_4W, "fp8_f16": False})
    out, ref_out = {"batch": bs, "len": length}, None
    for label, (fp8, cfg) in launches.items():
        (kb, vb), sc = ((k8, v8), scales) if fp8 else ((x["k"], x["v"]), None)
        n_splits = num_kv_splits(bs, attn.KV_HEADS, sms, config=cfg, pool=fab._pool(fp8), head_dim=attn.HEAD_DIM)

        def run(i: int, kb=kb, vb=vb, sc=sc, cfg=cfg, n_splits=n_splits):
            return decode_attention(x["q"], kb, vb, x["table"], x["idx"][i % x["copies"]], x["lens"], attn.SCALE,
                                    n_splits, config=cfg, scales=sc)

        got = run(0).float()
        ref_out = got if ref_out is None else ref_out
        us = time_graph_us(run, max(x["copies"], 4))
        out[label] = {"launch": attn.launch_label(bs, cfg, fab._pool(fp8)), "splits": n_splits, "us": round(us, 1), "TBps": round((nbytes // 2 if fp8 else nbytes) / us / 1e6, 3),
                      "max_abs_diff_vs_bf16": round((got - ref_out).abs().max().item(), 5)}
    log(f"attention bs {bs} x {length}: {out}")
    return out


def _quantize_matches_torch(x: torch.Tensor) -> bool:
    """quantize_rows(x) gives quantize_rows_torch's e4m3 bits and (to float32 rounding) its scales."""
    from radixflow.kernels.fp8 import quantize_rows
    from radixflow.kernels.reference import quantize_rows_torch

    (q, s), (q_ref, s_ref) = quantize_rows(x), quantize_rows_torch(x)
    return torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.allclose(s, s_ref, rtol=1e-6, atol=0)


def _quantize_rates() -> dict:
    """The per-token activation quantization alone at the GEMMs' two widths and M of GEMM_MS: us, the
    bytes it must move (bf16 in, e4m3 out) per second, and whether it gives torch's bits."""
    from radixflow.kernels.fp8 import quantize_rows
    from radixflow.kernels.gemv import time_graph_us

    out = {}
    for k in (4096, 14336):
        for m in GEMM_MS:
            xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(max(2, math.ceil(2 * L2 / (2 * m * k))))]
            us = time_graph_us(lambda i: quantize_rows(xs[i % len(xs)]), max(len(xs), 8))
            out[f"k{k}_m{m}"] = {"us": round(us, 2), "TBps": round(3 * m * k / us / 1e6, 3),
                                 "matches_torch": _quantize_matches_torch(xs[0])}
    log(f"quantize: {out}")
    return out


# Decode batches up to 1,024, on and off multiples of 128 (the offline workload's steps take every size)
GEMM_SWEEP_MS = (16, 48, 100, 136, 200, 264, 300, 384, 400, 448, 512, 528, 544, 576, 640, 656, 768, 896, 912, 1024)


def _gemm_m_sweep(name: str, n: int, k: int) -> dict:
    """The FP8 product alone (quantized inputs) across GEMM_SWEEP_MS, us per call in a CUDA graph: row-wise
    torch._scaled_mm over the rows as they are (named as in _gemm_rates); over the rows padded as the engine pads
    them (kernels/fp8.gemm_rows, the padded product's extra rows dropped); with fast accumulation; swapped (weight
    as the left operand, out.T = W @ x.T, so the batch is the product's inner tile dimension, then transposed
    back with a copy, counted); padded with fast accumulation (the engine's product since session 33); cuBLAS's
    one-scale-per-tensor product with fast accumulation (scales 1), alone and with the row and column scales applied
    after it by two elementwise multiplies (could a kernel that reads the output apply them?); and bf16 F.linear of
    the same shape. Does the row-wise kernel pay for 128-row
    tiles, as the offline steps' fit suggests, and does a swapped product avoid it?"""
    import torch.nn.functional as F

    from radixflow.kernels.fp8 import gemm_rows, quantize_rows

    weights, quantized = _gemm_weights(n, k)
    copies = len(weights)
    out, one = {}, torch.ones((), device="cuda")
    for m in GEMM_SWEEP_MS:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        xq, xs = quantize_rows(x)
        pq, ps = quantize_rows(x, alloc_rows=gemm_rows(m))

        def swapped(i: int):
            wq, ws = quantized[i % copies]
            return _scaled_mm(wq, ws, xq, xs).t().contiguous()

        def tensorwise(i: int, rescale: bool) -> torch.Tensor:
            wq, ws = quantized[i % copies]
            out = torch._scaled_mm(xq, wq.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True)
            return out.mul_(xs[:, None]).mul_(ws[None, :]) if rescale else out

        variants = {"scaled_mm_only": lambda i: _scaled_mm(xq, xs, *quantized[i % copies]),
                    "scaled_mm_padded": lambda i: _scaled_mm(pq, ps, *quantized[i % copies])[:m],
                    "scaled_mm_fast_accum": lambda i: _scaled_mm(xq, xs, *quantized[i % copies], fast=True),
                    "scaled_mm_padded_fast": lambda i: _scaled_mm(pq, ps, *quantized[i % copies], fast=True)[:m],
                    "tensorwise_fast": lambda i: tensorwise(i, False),
                    "tensorwise_fast_rescaled": lambda i: tensorwise(i, True),
                    "scaled_mm_swapped": swapped, "bf16_linear": lambda i: F.linear(x, weights[i % copies])}
        row = _time_variants(variants, copies)
        if all(isinstance(row[label], float) for label in ("scaled_mm_padded_fast", "tensorwise_fast_rescaled")):
            want = variants["scaled_mm_padded_fast"](0).float()  # the engine's product: the rescaled one's yardstick
            row["rescaled_max_rel_diff"] = ((variants["tensorwise_fast_rescaled"](0).float() - want).abs().max()
                                            / want.abs().max()).item()
        if all(isinstance(row[label], float) for label in ("scaled_mm_only", "scaled_mm_swapped")):
            ref = variants["scaled_mm_only"](0).float()  # the same product up to the order of accumulation
            row["swapped_max_rel_diff"] = float((swapped(0).float() - ref).abs().max() / ref.abs().max())
        _add_tflops(row, 2 * m * n * k, ("scaled_mm_only", "scaled_mm_padded", "scaled_mm_padded_fast", "tensorwise_fast",
                                         "tensorwise_fast_rescaled", "scaled_mm_swapped", "bf16_linear"))
        out[f"m{m}"] = row
    log(f"gemm_m {name} {n}x{k}: {out}")
    return out


PARTS = ("gemv", "gemm", "gemm_m", "attention", "quantize")


def fp8_kernel_parts(spec: str) -> list:
    """--fp8-kernels' comma-separated parts; a name not among PARTS ends the run (a misspelt one would
    silently time nothing)."""
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        raise SystemExit(f"--fp8-kernels: unknown part(s) {unknown or [spec]}; choose from {', '.join(PARTS)}")
    return parts


def sec_fp8_kernels() -> dict:
    parts = fp8_kernel_parts(OPTS.fp8_kernels)
    if not torch.cuda.is_available():
        return {"skipped": "CUDA only"}
    out = {"gemv": {}, "attention": {}}
    for name, (n, k) in GEMV_SHAPES.items() if "gemv" in parts else ():
        out["gemv"][name] = _gemv_rates(name, n, k)
        free()  # the shape's weights
    for name, (n, k) in GEMV_SHAPES.items() if "gemm" in parts else ():
        out.setdefault("gemm", {})[name] = _gemm_rates(name, n, k)
        free()
    for name, (n, k) in GEMV_SHAPES.items() if "gemm_m" in parts else ():
        out.setdefault("gemm_m", {})[name] = _gemm_m_sweep(name, n, k)
        free()
    if "quantize" in parts:
        out["quantize"] = _quantize_rates()
    for bs, length in ATTN_CASES if "attention" in parts else ():
        out["attention"][f"{bs}x{length}"] = _attention_rates(bs, length)
        free()
    return out
