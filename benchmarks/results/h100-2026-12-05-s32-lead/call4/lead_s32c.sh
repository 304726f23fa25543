# Session 32, call 4 (H100): the 1,000 in / 1,000 out workload in FP8 weights + FP8 KV with --mem-fraction-static 0.95
# (two waves instead of three: at the default 0.85 the pool held 474 requests at their 2,000-token peak).
source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
export PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .gpulead/lead_s32c.sh $OUT/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu,memory.total --format=csv > $OUT/gpu.txt; cat $OUT/gpu.txt
echo "== $(date +%T) offline_1k@fp8kv8 at --mem-fraction-static 0.95"
timeout 540 python3 benchmarks/gpu_bench.py --out $OUT/b --tokenizer .gpulead/.gpu_assets/tokenizer --mem-fraction-static 0.95 --sections offline_1k@fp8kv8 --deadline-s 400 > $OUT/b.log 2>&1; echo rc $?
python3 - $OUT/b/results.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for sec, v in d.items():
    if isinstance(v, dict):
        print(sec, {k: (round(x, 3) if isinstance(x, float) else x) for k, x in v.items() if not isinstance(x, (dict, list))})
        for k, x in v.items():
            if isinstance(x, dict) and k.startswith(("seed", "cold")):
                print("  ", k, {kk: (round(xx, 3) if isinstance(xx, float) else xx) for kk, xx in x.items() if not isinstance(xx, (dict, list))})
PY
tail -5 $OUT/b.log
echo "== $(date +%T) end"
