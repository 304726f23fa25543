"""Compile every decode-path Triton kernel for an H100/H200 (sm_90), without a GPU:

    python tests/sm90_compile.py      # exit status 1 and the errors if any kernel fails

The CPU interpreter runs kernels as numpy code and so misses what only the compiler checks
(a loop-carried value changing dtype, branches returning different shapes, PDL intrinsics).
Triton ships its own ptxas, so compiling to a cubin here catches those before a GPU run.
Run as its own process: TRITON_INTERPRET must be unset when the kernels are imported.
"""

from __future__ import annotations

import os
import re
import sys
import traceback

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from radixflow.kernels import (  # noqa: E402
    argmax, decode_attention, extend_attention, fp8, gemv, gemv_epilogue, kv_store, matmul, norm_act, rotary, sampling,
)

SM90 = GPUTarget("cuda", 90, 32)
BF16 = "*bf16"
FP8 = "*fp8e4nv"


def _compile(fn, signature: dict, constexprs: dict, **options) -> str:
    """PTX of fn for sm_90; pointers and int arguments get the divisibility hints the JIT gives them.
    A runtime argument named in constexprs is specialised to that value, as the JIT does with 1."""
    sig = dict(signature, **{name: "constexpr" for name in constexprs})
    names = list(sig)
    hints = {(names.index(n),): [["tt.divisibility", 16]] for n, t in sig.items() if t.startswith("*") or t == "i32"}
    return triton.compile(ASTSource(fn, sig, constexprs, attrs=hints), target=SM90, options=options).asm["ptx"]


def _ints(*names: str) -> dict:
    return {n: "i32" for n in names}


def check_gemv(pdl: int, block_m: int, weight: str = BF16) -> None:
    """The GEMV with each of its configs; weight "*fp8e4nv": the FP8 GEMV (per-row scales) with its own."""
    fp8_w = weight != BF16
    sig = {"X": BF16, "W": weight, "Bias": BF16, "Scale": "*fp32" if fp8_w else BF16, "Out": BF16,
           **_ints("M", "N", "K", "stride_xm", "stride_wn", "stride_om")}
    for cfg in gemv.GEMV_CONFIGS_FP8 if fp8_w else gemv.GEMV_CONFIGS:
        consts = {"HAS_BIAS": block_m == 4, "HAS_SCALE": fp8_w, "USE_PDL": pdl, "BLOCK_M": block_m,
                  "BLOCK_N": cfg["block_n"], "BLOCK_K": gemv.gemv_block_k(cfg, block_m),
                  "UNROLL": cfg.get("unroll", 1), "STAGES": cfg["stages"]}
        ptx = _compile(gemv._gemv_kernel, sig, consts, num_warps=cfg["num_warps"], launch_pdl=pdl > 0)
        assert _pdl_order_ok(ptx, pdl)
        assert "cp.async" in ptx, "the K loop is no longer pipelined through shared memory"
        if pdl:  # the first weight tile is requested before the wait
            assert ptx.index("ld.global") < ptx.index("griddepcontrol.wait")


def check_gemv_fp8_words(pdl: int, block_m: int) -> None:
    """The FP8 GEMV that reads int32 words: pipelined, and no flush-to-zero (e4m3 subnormals arrive as float32 ones)."""
    sig = {"X": BF16, "W": "*i32", "Scale": "*fp32", "Bias": BF16, "Out": BF16,
           **_ints("M", "N", "K", "stride_xm", "stride_wn", "stride_om")}
    for cfg in (c for c in gemv.GEMV_CONFIGS_FP8 if c.get("words")):
        consts = {"HAS_BIAS": block_m == 4, "USE_PDL": pdl, "BLOCK_M": block_m, "BLOCK_N": cfg["block_n"],
                  "BLOCK_W": gemv.gemv_block_w(cfg, block_m), "STAGES": cfg["stages"]}
        ptx = _compile(gemv._gemv_fp8_words_kernel, sig, consts, num_warps=cfg["num_warps"], launch_pdl=pdl > 0)
        assert _pdl_order_ok(ptx, pdl) and "cp.async" in ptx and ".ftz" not in ptx


def check_fp8_quantize(pdl: int) -> None:
    """Per-token FP8 quantization of bf16 activations (kernels/fp8.py): a 14,336-wide row held in registers
    (one pass) and in 2,048-wide blocks (two passes); the GPU's own rounding conversion, no emulated rounding
    (round_to_e4m3's floor) on the GPU, and no approximate division."""
    sig = {"X": BF16, "Q": "*fp8e4nv", "S": "*fp32", **_ints("K", "stride_x", "stride_q")}
    for block, one_pass, warps in ((16384, True, 8), (2048, False, 4)):
        consts = {"BLOCK": block, "ONE_PASS": one_pass, "USE_PDL": pdl}
        ptx = _compile(fp8._quantize_rows_kernel, sig, consts, num_warps=warps, launch_pdl=pdl > 0)
        assert _pdl_order_ok(ptx, pdl) and _rounds_to_e4m3_as_torch(ptx)


def check_norm_and_activation(pdl: int) -> None:
    """RMSNorm (+ residual) and SiLU-and-mul, storing bf16 rows, and storing FP8 rows with their scales for an
    FP8 GEMM (QUANT: the GPU's rounding conversion after an IEEE division, as quantize_rows)."""
    for quant in (False, True):
        out = "*fp8e4nv" if quant else BF16
        sig = {"X": BF16, "R": "*fp32", "W": BF16, "Out": out, "ROut": "*fp32", "S": "*fp32",  # float32 stream
               **_ints("stride_x", "stride_r", "stride_o", "stride_ro", "N"), "eps": "fp32"}
        consts = {"HAS_RES": True, "BLOCK": 4096, "QUANT": quant, "USE_PDL": pdl}
        ptx = _compile(norm_act._rmsnorm_kernel, sig, consts, launch_pdl=pdl > 0)
        assert _pdl_order_ok(ptx, pdl) and (not quant or _quantizes_as_torch(ptx))
        sig = {"X": BF16, "Out": out, "S": "*fp32" if quant else BF16, **_ints("stride_x", "stride_o", "N")}
        for interleaved in (False, True):
            consts = {"BLOCK": 16384 if quant else 2048, "INTERLEAVED": interleaved, "QUANT": quant, "USE_PDL": pdl}
            ptx = _compile(norm_act._silu_mul_kernel, sig, consts, num_warps=16 if quant else 8, launch_pdl=pdl > 0)
            assert not quant or _quantizes_as_torch(ptx)


# per epilogue, the config the H200's chooser picked for the layer that runs it (benchmarks/history/, session 11):
# the K loop is the plain GEMV's, compiled at every config by check_gemv
EPILOGUE_CONFIGS = {"bf16": {"rstd": 1, "silu": 1, "residual": 2}, "fp8": {"rstd": 0, "silu": 2, "residual": 1}}


def check_gemv_epilogue(pdl: int, weight: str = BF16) -> None:
    """kernels/gemv_epilogue.py's three epilogues (rstd: qkv; rstd + SiLU-and-mul: gate_up; residual + sums of
    squares: o_proj, down): pipelined as the plain GEMV, the first weight tile before the wait. At one row, and
    at four where the epilogue handles rows (SiLU's reshape, the sums' [programs, rows] partials); the K loop
    at every row count and config is the plain GEMV's, compiled by check_gemv."""
    fp8_w = weight != BF16
    sig = {"X": BF16, "W": weight, "Bias": BF16, "Scale": "*fp32" if fp8_w else BF16, "Out": BF16, "Res": "*fp32",
           "ResOut": "*fp32", "SumIn": "*fp32", "SumOut": "*fp32", "Partials": "*fp32", "Ticket": "*i32",
           **_ints("M", "N", "K", "stride_xm", "stride_wn", "stride_om", "stride_r"), "eps": "fp32"}
    configs = gemv.GEMV_CONFIGS_FP8 if fp8_w else gemv.GEMV_CONFIGS
    for kind, index in EPILOGUE_CONFIGS["fp8" if fp8_w else "bf16"].items():
        cfg = configs[index]
        programs = 4096 // cfg["block_n"]  # Llama-3-8B's o_proj / down
        for block_m in (1,) if kind == "rstd" else (1, 4):
            consts = {"PROGRAMS": programs, "BLOCK_P": programs, "HAS_BIAS": block_m == 4, "HAS_SCALE": fp8_w,
                      "NORM_IN": kind != "residual", "RESIDUAL": kind == "residual", "SILU": kind == "silu",
                      "USE_PDL": pdl, "BLOCK_M": block_m, "BLOCK_N": cfg["block_n"],
                      "BLOCK_K": gemv.gemv_block_k(cfg, block_m), "UNROLL": cfg.get("unroll", 1),
                      "STAGES": cfg["stages"]}
            ptx = _compile(gemv_epilogue._gemv_epilogue_kernel, sig, consts, num_warps=cfg["num_warps"],
                           launch_pdl=pdl > 0)
            assert _pdl_order_ok(ptx, pdl) and "cp.async" in ptx
            # the sums: a ticket taken with acq_rel after a CTA barrier, no float atomics (run-to-run bits)
            assert kind != "residual" or (re.search(r"atom\S*acq_rel\S*\.add", ptx) and "bar.sync" in ptx
                                          and not re.search(r"(atom|red)\S*\.f32", ptx))
            if pdl:
                assert ptx.index("ld.global") < ptx.index("griddepcontrol.wait")


def check_rotary_and_kv_store(pdl: int) -> None:
    sig = {"Q": BF16, "K": BF16, "V": BF16, "Pos": "*i64", "Cos": "*fp32", "Sin": "*fp32", "KBuf": BF16, "VBuf": BF16,
           "Loc": "*i64", **_ints("stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh",
                                  "stride_cos", "stride_bt", "stride_bh", "HQ", "HK", "HALF")}
    for store in (True, False):
        consts = {"BLOCK_HQ": 32, "BLOCK_HK": 8, "BLOCK_D": 64, "STORE_KV": store, "USE_PDL": pdl}
        _compile(rotary._rotary_store_kv_kernel, sig, consts, launch_pdl=pdl > 0)
    for pool in (BF16, FP8):  # an FP8 pool stores k / k_scale per head
        sig = {"K": BF16, "V": BF16, "KBuf": pool, "VBuf": pool, "Loc": "*i64", "KScale": "*fp32", "VScale": "*fp32",
               **_ints("stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_bt", "stride_bh", "H", "D")}
        consts = {"BLOCK_H": 8, "BLOCK_D": 128, "KV_FP8": pool == FP8, "USE_PDL": pdl}
        ptx = _compile(kv_store._store_kv_kernel, sig, consts, launch_pdl=pdl > 0)
        assert pool != FP8 or _rounds_to_e4m3_as_torch(ptx)  # the same bytes as KVPool.store


def check_argmax() -> None:
    _compile(argmax._argmax_blocks, {"X": "*fp32", "Val": "*fp32", "Idx": "*i32", **_ints("V", "stride_x", "num_blocks")},
             {"BLOCK": argmax.BLOCK_V}, num_warps=8)
    _compile(argmax._argmax_rows, {"Val": "*fp32", "Idx": "*i32", "Out": "*i64", "num_blocks": "i32"}, {"BLOCK_B": 32},
             num_warps=1)


def check_sampling() -> None:
    sig = {"Logits": "*fp32", "InvTemp": "*fp32", "ChunkMax": "*fp32", "ChunkSum": "*fp32", "ChunkTop": "*fp32",
           **_ints("stride", "V", "num_chunks")}
    ptx = _compile(sampling._chunk_stats, sig, {"BLOCK": sampling.BLOCK_V}, num_warps=4)
    assert "st.global" in ptx
    sig = {"Logits": "*fp32", "InvTemp": "*fp32", "TopP": "*fp32", "LogMinP": "*fp32", "TopK": "*fp32",
           "Seeds": "*i64", "Counters": "*i64", "ChunkMax": "*fp32", "ChunkSum": "*fp32", "ChunkTop": "*fp32",
           "Out": "*i64", "Rounds": "*i32", **_ints("stride", "V", "num_chunks")}
    for store_rounds in (False, True):
        ptx = _compile(sampling._draw, sig, {"BLOCK": sampling.BLOCK_V, "CHUNKS": 32, "MAX_ROUNDS": sampling.MAX_ROUNDS,
                                             "STORE_ROUNDS": store_rounds}, num_warps=8)
        assert "st.global" in ptx


def _rounds_to_e4m3_as_torch(ptx: str) -> bool:
    """The GPU's own rounding conversion to e4m3, no emulated rounding (round_to_e4m3's floor), and IEEE
    division as torch's: Triton's `/` is an approximate division whose quotient can round the other way."""
    return ("cvt.rn.satfinite.e4m3x2.f32" in ptx and "cvt.rmi" not in ptx
            and "div.full" not in ptx and "div.approx" not in ptx)


def _quantizes_as_torch(ptx: str) -> bool:
    """A kernel that also divides elsewhere (RMSNorm's mean, SiLU): its quantization still converts with the
    GPU's rounding, emulates none, and divides by the scale in IEEE round-to-nearest (div_rn)."""
    return "cvt.rn.satfinite.e4m3x2.f32" in ptx and "cvt.rmi" not in ptx and "div.rn.f32" in ptx


def _pdl_order_ok(ptx: str, pdl: int) -> bool:
    """USE_PDL=0: no PDL instruction; 1: the trigger after the wait; 2: before it (kernels/pdl.py)."""
    if not pdl:
        return "griddepcontrol" not in ptx
    wait, trigger = ptx.find("griddepcontrol.wait"), ptx.find("griddepcontrol.launch_dependents")
    return wait >= 0 and trigger >= 0 and (trigger < wait) == (pdl == 2)


def _waits_first(ptx: str) -> bool:
    """griddepcontrol.wait comes before the kernel's first global load, async copy or store."""
    first = min(ptx.find(op) for op in ("ld.global", "cp.async", "st.global") if op in ptx)
    return ptx.index("griddepcontrol.wait") < first


def check_decode_attention(pdl: int) -> None:
    """Both stages at Llama-3-8B heads (groups of 4, head dim 128) with DECODE_CONFIG's block shape:
    stage 1 with one split writing the output (direct; the JIT makes num_splits 1 a constant) and
    with 16 splits writing float32 partials, and stage 2 merging 16 splits."""
    cfg = decode_attention.DECODE_CONFIG
    sig = {"Q": BF16, "K": BF16, "V": BF16, "ReqToToken": "*i32", "ReqIdx": "*i64", "SeqLens": "*i64",
           "MidO": "*fp32", "MidLse": "*fp32", "Out": BF16,
           "Pos": "*i64", "Cos": "*fp32", "Sin": "*fp32", "KNew": BF16, "VNew": BF16, "Loc": "*i64",
           "KScale": "*fp32", "VScale": "*fp32",
           **_ints("stride_qb", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_r2t",
                   "stride_mb", "stride_mh", "stride_ms", "stride_lb", "stride_lh", "stride_ob", "stride_oh",
                   "stride_cos", "stride_knb", "stride_knh", "stride_vnb", "stride_vnh"),
           "scale": "fp32", **_ints("num_splits", "split_align", "D")}
    consts = {"GROUP": 4, "BLOCK_H": 16, "BLOCK_N": cfg["block_n"], "BLOCK_D": 128, "IEEE": False, "USE_PDL": pdl,
              "EXP2": False}
    fp8_sig = dict(sig, K=FP8, V=FP8)  # an FP8 KV pool
    off = {"KV_FP8": False, "KV_F16": False, "V_REGS": False}
    f16 = {"KV_FP8": True, "KV_F16": True, "V_REGS": True}  # an FP8 pool widened to float16, V in registers
    e2 = {**f16, "EXP2": True}  # ... with scores in log2 units (issue 28, session 11)
    for extra in ({"num_splits": 1, "DIRECT": True, "ROPE": True, "P_PARTS": 2, **off},
                  {"DIRECT": False, "ROPE": True, "P_PARTS": 3, **off},
                  {"DIRECT": False, "ROPE": False, "P_PARTS": 1, **off},
                  {"num_splits": 1, "DIRECT": True, "ROPE": True, "P_PARTS": 2, **f16},
                  {"DIRECT": False, "ROPE": False, "P_PARTS": 2, **f16},
                  {"num_splits": 1, "DIRECT": True, "ROPE": False, "P_PARTS": 1, **f16, "V_REGS": False},
                  {"DIRECT": False, "ROPE": False, "P_PARTS": 2, "KV_FP8": True, "KV_F16": False, "V_REGS": False},
                  {"num_splits": 1, "DIRECT": True, "ROPE": False, "P_PARTS": 1, **e2},
                  {"DIRECT": False, "ROPE": True, "P_PARTS": 1, **e2}):
        launch = decode_attention.resolve_config(256, pool="fp8" if extra["KV_FP8"] else "bf16", head_dim=128,
                                                 kv_heads=8)
        ptx = _compile(decode_attention._decode_stage1, fp8_sig if extra["KV_FP8"] else sig,
                       {**consts, **extra, "BLOCK_N": launch["block_n"]},
                       num_warps=launch["num_warps"], num_stages=launch["num_stages"], launch_pdl=pdl > 0)
        assert _pdl_order_ok(ptx, pdl) and (not pdl or _waits_first(ptx))
        if extra["KV_F16"]:  # e4m3 -> float16 in one step, no float16 -> bf16 conversions left
            assert "cvt.rn.f16x2.e4m3x2" in ptx and "cvt.bf16.f16" not in ptx
        # V of p @ v: with V_REGS the float16 tile reaches the operand through the transposing ldmatrix, as
        # a 16-bit pool's does; without it Triton reads the 8-bit tile a byte at a time
        byte_reads = "ld.shared.b8" in ptx or "ld.shared.u8" in ptx
        assert byte_reads == (extra["KV_FP8"] and not extra["V_REGS"]), extra
        assert ("ldmatrix.sync.aligned.m8n8.x4.trans" in ptx) == (not byte_reads), extra
        if extra["KV_FP8"]:  # DECODE_CONFIG's FP8 launch keeps the next block's K / V copies in flight in the loop
            assert re.search(r"cp\.async\.wait_group\s+[1-9]", ptx), extra
        assert ("ex2.approx.ftz.f32" in ptx) == extra.get("EXP2", False), extra  # the softmax's exp without range test
        if extra["KV_FP8"] and extra["ROPE"]:  # the new token's K and V stored as KVPool.store rounds them
            assert "div.rn" in ptx and "cvt.rmi" not in ptx
    sig = {"MidO": "*fp32", "MidLse": "*fp32", "Out": BF16,
           **_ints("stride_mb", "stride_mh", "stride_ms", "stride_lb", "stride_lh", "stride_ob", "stride_oh",
                   "num_splits", "D")}
    ptx = _compile(decode_attention._decode_stage2, sig, {"BLOCK_S": 16, "BLOCK_D": 128, "USE_PDL": pdl},
                   num_warps=4, launch_pdl=pdl > 0)
    assert _pdl_order_ok(ptx, pdl) and (not pdl or _waits_first(ptx))


def check_extend_attention() -> None:
    """Extend (prefill) attention at Llama-3-8B heads (4 query heads a KV head), bf16, p in 2 and in 3 parts,
    at every block size the launch picks (16 rows: one new token's heads; 128: long chunks)."""
    sig = {"Q": BF16, "K": BF16, "V": BF16, "Out": BF16, "ReqToToken": "*i32", "ReqIdx": "*i64",
           "PrefixLens": "*i64", "ExtendLens": "*i64", "QStart": "*i64",
           **_ints("stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_ot",
                   "stride_oh", "stride_r2t"), "scale": "fp32", "GROUP": "constexpr", **_ints("D"), "KScale": "*fp32",
           "VScale": "*fp32"}  # GROUP where the kernel has it: the hints go by position
    for tokens in (1, 8, 16, 1024):
        block_m, block_n, warps = extend_attention._blocks(torch.bfloat16, 128, 4 * tokens)
        for parts, kv_fp8 in ((2, False), (3, False), (2, True)):
            consts = {"GROUP": 4, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_D": 128, "IEEE": False,
                      "P_PARTS": parts, "KV_FP8": kv_fp8, "KV_F16": kv_fp8}
            _compile(extend_attention._extend_kernel, dict(sig, K=FP8, V=FP8) if kv_fp8 else sig, consts,
                     num_warps=warps, num_stages=2)


def check_matmul() -> None:
    """The batch-invariant matmul's three tile configs, bf16 out and (the output head) float32 out."""
    for config in (matmul.TINY, matmul.SMALL, matmul.LARGE):
        bm, bn, bk, warps, stages = config
        for out in (BF16, "*fp32"):
            sig = {"X": BF16, "W": BF16, "Bias": BF16, "Out": out, **_ints("M", "N", "K", "stride_xm", "stride_wn", "stride_om")}
            consts = {"HAS_BIAS": out == BF16, "IEEE": False, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}
            ptx = _compile(matmul._matmul_kernel, sig, consts, num_warps=warps, num_stages=stages)
            assert "mma" in ptx, "no tensor-core MMA in the matmul"


def main() -> int:
    checks = [(check_gemv, (pdl, m)) for pdl in (0, 1, 2) for m in (1, 4)]
    checks += [(check_gemv, (pdl, m, "*fp8e4nv")) for pdl in (0, 2) for m in (1, 4)]
    checks += [(check_gemv_fp8_words, (pdl, m)) for pdl in (0, 2) for m in (1, 4)]
    checks += [(check_gemv_epilogue, (2, w)) for w in (BF16, FP8)]  # PDL 0 / 1: the K loop is check_gemv's
    checks += [(check_fp8_quantize, (pdl,)) for pdl in (0, 2)]
    checks += [(fn, (pdl,)) for fn in (check_norm_and_activation, check_rotary_and_kv_store, check_decode_attention)
               for pdl in (0, 1, 2)]
    checks += [(fn, ()) for fn in (check_argmax, check_sampling, check_extend_attention, check_matmul)]
    failed = 0
    for fn, args in checks:
        try:
            fn(*args)
            print(f"ok   {fn.__name__}{args}")
        except Exception:
            failed += 1
            print(f"FAIL {fn.__name__}{args}\n{traceback.format_exc()[-3000:]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
