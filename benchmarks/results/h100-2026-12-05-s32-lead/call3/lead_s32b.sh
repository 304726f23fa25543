# Session 32, call 3 (H100): the 1,000 in / 1,000 out workload in FP8 weights + FP8 KV (TensorRT-LLM publishes
# 15,220 out tok/s on one H100 SXM), then offline seed 2024 in FP8+FP8 KV and in bf16 (the FP8 / bf16 ratio).
source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
export PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .gpulead/lead_s32b.sh $OUT/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu,memory.total --format=csv > $OUT/gpu.txt; cat $OUT/gpu.txt
echo "== $(date +%T) offline_1k@fp8kv8,offline@fp8kv8,offline"
timeout 540 python3 benchmarks/gpu_bench.py --out $OUT/b --tokenizer .gpulead/.gpu_assets/tokenizer --offline-seeds 2024 --offline-warmup 64 --sections offline_1k@fp8kv8,offline@fp8kv8,offline --deadline-s 500 > $OUT/b.log 2>&1; echo rc $?
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
