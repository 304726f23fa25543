# Session 33, call A: (1) FP8 GEMMs with fast accumulation (KernelSettings.fp8_fast_accum): fp8_kernels' GEMM part
# (speed, and the product's error with each accumulation against float64); (2) the 1,000 in / 1,000 out workload (FP8 weights + FP8 KV, --mem-fraction-static 0.95) and offline seed 2024 with
# exact (fp8kv8) then fast accumulation (fp8kv8fa), one engine each; (3) the FP8 GEMM tests.
source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
export PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .gpulead/lead_s33a.sh $OUT/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu.txt; cat $OUT/gpu.txt
T=$PWD/.gpulead/.gpu_assets/tokenizer
export RADIXFLOW_TOKENIZER=$T
echo "== $(date +%T) fp8_kernels gemm"
timeout 100 python3 benchmarks/gpu_bench.py --out $OUT/k --tokenizer $T --sections fp8_kernels --fp8-kernels gemm --deadline-s 90 > $OUT/k.log 2>&1; echo rc $?
python3 - $OUT/k/results.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["fp8_kernels"]
for shape, rows in d.get("gemm", {}).items():
    for m, r in rows.items():
        print(shape, m, "us exact/fast/tensorwise", r.get("scaled_mm_only"), r.get("scaled_mm_fast_accum"), r.get("scaled_mm_tensorwise"),
              "err exact/fast/bf16/quant", r.get("exact_accum_rel_err"), r.get("fast_accum_rel_err"), r.get("bf16_rounding_rel_err"), r.get("quantization_rel_err"))
PY
summ() {
python3 - $1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for sec, v in d.items():
    if isinstance(v, dict):
        print(" ", sec, {k: (round(x, 3) if isinstance(x, float) else x) for k, x in v.items() if k in ("s", "out_tok_s", "extend_gpu_s", "decode_gpu_s", "kv_pool_tokens", "decode_steps")})
        for k, x in v.items():
            if isinstance(x, dict) and k.startswith("seed"):
                print("   ", k, {kk: (round(xx, 3) if isinstance(xx, float) else xx) for kk, xx in x.items() if kk in ("s", "out_tok_s", "extend_gpu_s", "decode_gpu_s")})
PY
}
echo "== $(date +%T) 1k/1k and offline, exact then fast accumulation"
timeout 340 python3 benchmarks/gpu_bench.py --out $OUT/e --tokenizer $T --mem-fraction-static 0.95 --offline-seeds 2024 --offline-warmup 64 --sections offline_1k@fp8kv8,offline@fp8kv8,offline_1k@fp8kv8fa,offline@fp8kv8fa --deadline-s 330 > $OUT/e.log 2>&1; echo rc $?
summ $OUT/e/results.json
echo "== $(date +%T) GPU tests"
timeout 40 python3 -m pytest -q tests/test_fp8.py -k "gemm" > $OUT/pytest.txt 2>&1; echo rc $?; tail -2 $OUT/pytest.txt
echo "== $(date +%T) end"
