# Session 33, call B: offline (1,000 requests, in U[32,1024], out U[32,512]) on three seeds in bf16, FP8
# weights, and FP8 weights + FP8 KV, one engine each, this tree, FP8 GEMMs with fast accumulation (variants fp8fa, fp8kv8fa).
source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
export PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .gpulead/lead_s33b.sh $OUT/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu.txt; cat $OUT/gpu.txt
echo "== $(date +%T) offline,offline@fp8,offline@fp8kv8"
timeout 570 python3 benchmarks/gpu_bench.py --out $OUT/o --tokenizer .gpulead/.gpu_assets/tokenizer --offline-warmup 64 --sections offline,offline@fp8fa,offline@fp8kv8fa --deadline-s 540 > $OUT/o.log 2>&1; echo rc $?
python3 - $OUT/o/results.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for sec, v in d.items():
    if isinstance(v, dict):
        print(sec, {k: round(x, 1) for k, x in v.items() if k.startswith("out_tok_s")})
        for k, x in v.items():
            if isinstance(x, dict) and k.startswith("seed"):
                print("   ", k, {kk: (round(xx, 3) if isinstance(xx, float) else xx) for kk, xx in x.items() if kk in ("s", "out_tok_s", "extend_gpu_s", "decode_gpu_s", "decode_mean_bs", "skipped")})
PY
echo "== $(date +%T) end"
