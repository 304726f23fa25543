# Session 32, call 6 (H100): the FP8 GEMM's rows padded to a multiple of 128 (kernels/fp8.gemm_rows). The 1,000 in /
# 1,000 out workload (FP8 weights + FP8 KV, --mem-fraction-static 0.95: two waves) and offline seed 2024, in this
# tree (head) and in the session's start tree 4c244a8 (base), one engine each; then the GEMM sweep with the padded
# product beside the unpadded one; then the FP8 GEMM tests.
source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
export PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .gpulead/lead_s32e.sh $OUT/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu.txt; cat $OUT/gpu.txt
T=$PWD/.gpulead/.gpu_assets/tokenizer
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
for arm in head base; do
  d=$PWD; [ $arm = base ] && d=$PWD/.gpulead/base
  echo "== $(date +%T) $arm offline_1k@fp8kv8,offline@fp8kv8"
  (cd $d && PYTHONPATH=$d:/tmp/site timeout 200 python3 $d/benchmarks/gpu_bench.py --out $OUT/$arm --tokenizer $T --mem-fraction-static 0.95 --offline-seeds 2024 --offline-warmup 64 --sections offline_1k@fp8kv8,offline@fp8kv8 --deadline-s 180 > $OUT/$arm.log 2>&1; echo rc $?)
  summ $OUT/$arm/results.json
done
echo "== $(date +%T) fp8 gemm tests"
timeout 60 python3 -m pytest -q tests/test_fp8.py -k "gemm" > $OUT/pytest.txt 2>&1; echo rc $?; tail -2 $OUT/pytest.txt
echo "== $(date +%T) fp8_kernels gemm_m"
timeout 150 python3 benchmarks/gpu_bench.py --out $OUT/k --tokenizer $T --sections fp8_kernels --fp8-kernels gemm_m --deadline-s 140 > $OUT/k.log 2>&1; echo rc $?
python3 - $OUT/k/results.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["fp8_kernels"]
for shape, rows in d.get("gemm_m", {}).items():
    print(shape, " ".join(f"{m[1:]}:{r.get('scaled_mm_only')}/{r.get('scaled_mm_padded')}" for m, r in rows.items()))
PY
echo "== $(date +%T) end"
