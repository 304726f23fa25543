# Session 34, call C: does the FP8 GEMMs' wave quantization at 513+ rows cost more than the 513th request gains?
# 1k/1k (FP8 weights + FP8 KV, --mem-fraction-static 0.95) and offline seed 2024, with max_running_requests 1024
# (default) then 512, one engine each, then once more 1024 (order effects).
source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
export PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .gpulead/lead_s34c.sh $OUT/; git diff > $OUT/tree.diff
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu.txt; cat $OUT/gpu.txt
T=$PWD/.gpulead/.gpu_assets/tokenizer
export RADIXFLOW_TOKENIZER=$T
summ() {
python3 - $1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for sec, v in d.items():
    if isinstance(v, dict):
        print(" ", sec, {k: (round(x, 3) if isinstance(x, float) else x) for k, x in v.items() if k in ("s", "out_tok_s", "extend_gpu_s", "decode_gpu_s", "decode_steps", "decode_mean_bs", "mode_runs")})
        st = v.get("decode_steps_bs_kv_ms")
        if st:
            import collections
            by = collections.defaultdict(list)
            for bs, kv, ms in st: by[bs].append(ms)
            print("    steps by batch:", {b: (len(m), round(sum(m)/len(m), 2)) for b, m in sorted(by.items())[-6:]})
        for k, x in v.items():
            if isinstance(x, dict) and k.startswith("seed"):
                print("   ", k, {kk: (round(xx, 3) if isinstance(xx, float) else xx) for kk, xx in x.items() if kk in ("s", "out_tok_s", "extend_gpu_s", "decode_gpu_s", "decode_mean_bs")})
PY
}
echo "== $(date +%T) bench"
timeout 540 python3 benchmarks/gpu_bench.py --out $OUT/c --tokenizer $T --mem-fraction-static 0.95 --offline-seeds 2024 --offline-warmup 64 --sections offline_1k@fp8kv8,offline@fp8kv8,offline_1k@fp8kv8r512,offline@fp8kv8r512,offline_1k@fp8kv8 --deadline-s 470 > $OUT/c.log 2>&1; echo rc $?
summ $OUT/c/results.json
echo "== $(date +%T) end"
