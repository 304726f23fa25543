"""Does an FP8 KV pool's decode attention read faster with q quantized to e4m3 and the scores as K @ q^T?

Session 16 (Nsight Compute) had the FP8 pool's stage 1 bound by instructions, not DRAM: per 32-token block a warp
spends ~25 instructions a token and KV head, most of them the e4m3 -> float16 conversions (F2FP) and the register
copies feeding mma.sync. This probe's stage 1 turns the score product around: S^T = K @ q^T has the block's tokens
as its M dimension (64 or 128), so with 4 warps Triton issues Hopper's FP8 wgmma, reading K from shared memory as
stored, with no conversion and no register operands; q is quantized to e4m3 once a program (one scale a query
head, amax / 448). p @ v stays a float16 product (O^T = V^T @ P^T, V widened), so only K's half of the
conversions goes. The price is q's rounding: e4m3 keeps 3 mantissa bits, as the pool's K already does.

Each case (Llama-3-8B heads, slots a random permutation, as fp8_attn_bench) times, per layer call in a CUDA graph,
the committed path (`decode_attention` with DECODE_CONFIG) against the probe's variants, which use the committed
stage 2 to merge their splits; every variant is checked first against the float32 reference over the dequantized
pool, and its error is printed next to the committed kernel's. Also prints which MMA instructions each variant's
PTX holds (Triton versions differ in when they pick wgmma).

    python3 benchmarks/fp8_wgmma_probe.py [--cases 1000x1500,512x1536,256x1536,768xU] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from radixflow.kernels.attention_common import e4m3_to_f16_in_registers, exp2_ftz  # noqa: E402
from radixflow.kernels.decode_attention import _decode_stage2, decode_attention, num_kv_splits  # noqa: E402
from radixflow.kernels.fp8 import scaled_to_e4m3  # noqa: E402

LOG2E, LN2 = 1.4426950408889634, 0.6931471805599453


@triton.jit
def _stage1_kq(
    Q, K, V, ReqToToken, ReqIdx, SeqLens, MidO, MidLse, KScale, VScale,
    stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_r2t,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
    scale, num_splits, split_align,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, V_REGS: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    scale = scale * tl.load(KScale + kvh) * 1.4426950408889634  # scores in log2 units
    seq_len = tl.load(SeqLens + b).to(tl.int32)
    row = tl.load(ReqIdx + b).to(tl.int64)
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), split_align) * split_align
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    heads = kvh * GROUP + offs_h
    mask_h = offs_h < GROUP
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + heads[None, :] * stride_qh + offs_d[:, None], mask=mask_h[None, :], other=0.0)
    q = q.to(tl.float32)  # [D, H]: q^T
    amax = tl.max(tl.abs(q), axis=0)
    q_scale = tl.where(amax > 0, amax / 448.0, 1.0)
    q8 = scaled_to_e4m3(q, q_scale[None, :]).to(tl.float8e4nv)
    col_scale = q_scale * scale

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([D, BLOCK_H], tl.float32)  # O^T
    Slots = ReqToToken + row * stride_r2t
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        slot = tl.load(Slots + offs_n, mask=mask_n, other=0).to(tl.int64)
        k = tl.load(K + kvh * stride_kh + slot[:, None] * stride_kt + offs_d[None, :], mask=mask_n[:, None], other=0.0)
        v = tl.load(V + kvh * stride_vh + slot[:, None] * stride_vt + offs_d[None, :], mask=mask_n[:, None], other=0.0)
        s = tl.dot(k, q8) * col_scale[None, :]  # [N, H]: FP8 wgmma, K as stored
        s = tl.where(mask_n[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = exp2_ftz(m_i - m_new)
        p = exp2_ftz(s - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, axis=0)
        if V_REGS:
            v16 = e4m3_to_f16_in_registers(v)
        else:
            v16 = v.to(tl.float16)
        acc = acc * alpha[None, :] + tl.dot(tl.trans(v16), p.to(tl.float16))  # [D, N] @ [N, H]
        m_i = m_new
    m_i = m_i * 0.6931471805599453
    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[None, :] * tl.load(VScale + kvh)
    lse = tl.where(nonempty, m_i + tl.log(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    tl.store(MidO + b * stride_mb + heads[None, :] * stride_mh + split * stride_ms + offs_d[:, None], out,
             mask=mask_h[None, :])
    tl.store(MidLse + b * stride_lb + heads * stride_lh + split, lse, mask=mask_h)


def attention_kq(q, k8, v8, table, idx, lens, scale, splits, scales, block_n, block_h, stages, v_regs, warps=4):
    bsz, hq, d = q.shape
    hkv = k8.shape[1]
    out = torch.empty_like(q)
    mid_o = torch.empty((bsz, hq, splits, d), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((bsz, hq, splits), dtype=torch.float32, device=q.device)
    strides = (*mid_o.stride()[:3], *mid_lse.stride()[:2])
    kern = _stage1_kq[(bsz, hkv, splits)](
        q, k8, v8, table, idx, lens, mid_o, mid_lse, scales[0], scales[1],
        q.stride(0), q.stride(1), k8.stride(0), k8.stride(1), v8.stride(0), v8.stride(1), table.stride(0),
        *strides, scale, splits, block_n,
        GROUP=hq // hkv, BLOCK_H=block_h, BLOCK_N=block_n, D=d, V_REGS=v_regs, num_warps=warps, num_stages=stages,
    )
    _decode_stage2[(bsz, hq)](mid_o, mid_lse, out, *strides, out.stride(0), out.stride(1), splits, d,
                              BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=d, num_warps=4, USE_PDL=0)
    return out, kern


VARIANTS = [  # (block_n, block_h, num_stages, V widened in registers)
    (64, 8, 2, True), (64, 8, 3, True), (64, 8, 4, True), (64, 16, 3, True), (64, 8, 3, False),
    (128, 8, 2, True), (128, 8, 3, True), (32, 8, 3, True),
]


def mma_kinds(kern) -> str:
    ptx = kern.asm.get("ptx", "") if kern is not None else ""
    kinds = sorted(set(re.findall(r"(wgmma\.mma_async\.[\w.]+|mma\.sync\.aligned\.[\w.]+)", ptx)))
    return ", ".join(kinds) + f"; cvt e4m3: {len(re.findall(r'cvt.rn.f16x2.e4m3x2', ptx))}"


def run_case(name: str, sms: int) -> dict:
    import fp8_attn_bench as fab
    import gpu_attn_bench as attn
    from radixflow.kernels import reference as ref
    from radixflow.kernels.gemv import time_graph_us

    lens = fab.case_lengths(name)
    x = attn.make_inputs(lens)
    (k8, v8), scales, deq = fab.fp8_pool_dequantized(x)
    q, idx0 = x["q"], x["idx"][0]
    want = ref.decode_attention_ref(q.float(), *deq, x["table"], idx0, x["lens"], attn.SCALE)
    del deq
    nbytes = attn.kv_bytes(lens) // 2
    bs = len(lens)
    splits = num_kv_splits(bs, attn.KV_HEADS, sms, pool="fp8", head_dim=attn.HEAD_DIM)
    res = {"batch": bs, "len": sum(lens) / bs, "splits": splits, "runs": {}}

    def committed(i):
        return decode_attention(q, k8, v8, x["table"], x["idx"][i % x["copies"]], x["lens"], attn.SCALE, splits,
                                scales=scales)

    runs = [("committed", committed, None)]
    for bn, bh, st, vr in VARIANTS:
        for sp in (splits, 2 * splits):
            lab = f"kq_n{bn}h{bh}s{st}{'' if vr else '_vsmem'}_sp{sp}"

            def fn(i, bn=bn, bh=bh, st=st, vr=vr, sp=sp):
                return attention_kq(q, k8, v8, x["table"], x["idx"][i % x["copies"]], x["lens"], attn.SCALE, sp,
                                    scales, bn, bh, st, vr)[0]

            runs.append((lab, fn, (bn, bh, st, vr, sp)))
    for lab, fn, v in runs:
        r = res["runs"][lab] = {}
        try:
            o = fn(0)
            r["err"] = (o.float() - want).abs().max().item()
            if v is not None:
                r["mma"] = mma_kinds(attention_kq(q, k8, v8, x["table"], idx0, x["lens"], attn.SCALE, v[4], scales,
                                                  v[0], v[1], v[2], v[3])[1])
            r["us"] = time_graph_us(fn, max(x["copies"], 4))
            r["tbs"] = nbytes / r["us"] / 1e6
        except Exception as e:
            r["failed"] = repr(e)[:400]
        print(name, lab, {k: (round(val, 4) if isinstance(val, float) else val) for k, val in r.items()}, flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="1000x1500,512x1536,256x1536,768xU")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = {"gpu": torch.cuda.get_device_name(0), "triton": triton.__version__, "cases": {}}
    for name in args.cases.split(","):
        out["cases"][name] = run_case(name, sms)
    print(f"\n{out['gpu']}, triton {out['triton']}: us a layer call (TB/s of the FP8 pool), max abs error")
    for name, c in out["cases"].items():
        base = c["runs"]["committed"].get("us")
        print(f"{name} (batch {c['batch']}, mean {c['len']:.0f} tokens, {c['splits']} splits)")
        for lab, r in sorted(c["runs"].items(), key=lambda kv: kv[1].get("us", 1e9)):
            if "us" in r:
                print(f"  {lab:28} {r['us']:8.1f} ({r['tbs']:.2f})  x{base / r['us'] if base else 0:.3f}  err {r['err']:.4f}")
            else:
                print(f"  {lab:28} FAILED {r.get('failed', '')[:120]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
