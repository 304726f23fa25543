# Session 34, call E: does a cap at 512 running requests (one wave of the FP8 product's tiles for o_proj and down)
# help the offline workload too (FP8 weights + FP8 KV: mean decode batch 526-544 uncapped)? Seeds 2024 and 2025,
# capped then uncapped, one engine each, default memory fraction.
source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
export PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .gpulead/lead_s34e.sh $OUT/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu.txt; cat $OUT/gpu.txt
T=$PWD/.gpulead/.gpu_assets/tokenizer
echo "== $(date +%T) offline capped, then uncapped"
timeout 250 python3 benchmarks/gpu_bench.py --out $OUT/o --tokenizer $T --offline-seeds 2024,2025 --offline-warmup 64 --sections offline@fp8kv8r512,offline@fp8kv8 --deadline-s 150 > $OUT/o.log 2>&1; echo rc $?
python3 - $OUT/o/results.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for k, v in d.items():
    if isinstance(v, dict):
        for s, r in v.items():
            if s.startswith("seed") and isinstance(r, dict):
                print(" ", k, s, {kk: (round(x, 3) if isinstance(x, float) else x) for kk, x in r.items() if kk in ("s", "out_tok_s", "extend_gpu_s", "decode_gpu_s", "decode_steps", "decode_mean_bs", "skipped")})
PY
echo "== $(date +%T) end"
