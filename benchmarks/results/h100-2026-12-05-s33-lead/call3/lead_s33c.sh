# Session 33, call C (H200 if lent): FP8 GEMMs with fast accumulation, now the default (fp8kv8), against the float32
# accumulation before it (fp8kv8exact, --disable-fp8-fast-accum): the 1,000 in / 1,000 out workload (FP8 weights +
# FP8 KV, --mem-fraction-static 0.95) and offline seed 2024, one engine each; then the FP8 GEMM tests.
source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
export PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .gpulead/lead_s33c.sh $OUT/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu.txt; cat $OUT/gpu.txt
T=$PWD/.gpulead/.gpu_assets/tokenizer
export RADIXFLOW_TOKENIZER=$T
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
echo "== $(date +%T) 1k/1k and offline, fast (default) then exact accumulation"
timeout 420 python3 benchmarks/gpu_bench.py --out $OUT/e --tokenizer $T --mem-fraction-static 0.95 --offline-seeds 2024 --offline-warmup 64 --sections offline_1k@fp8kv8,offline@fp8kv8,offline_1k@fp8kv8exact,offline@fp8kv8exact --deadline-s 410 > $OUT/e.log 2>&1; echo rc $?
summ $OUT/e/results.json
echo "== $(date +%T) GPU tests"
timeout 40 python3 -m pytest -q tests/test_fp8.py -k "gemm" > $OUT/pytest.txt 2>&1; echo rc $?; tail -2 $OUT/pytest.txt
echo "== $(date +%T) end"
