# Session 35, call B (call A's machine): issue 28's table part 2: offline (1,000 requests, U[32,1024] in, U[32,512]
# out) on three seeds each, bf16, FP8 weights, FP8 weights + FP8 KV, in one run. Stashes the GGUF's part 2 for call C.
source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
export PYTHONUNBUFFERED=1
mkdir -p $OUT /tmp/rfmodel; cp .gpulead/lead_s35b.sh $OUT/
cp -r .gpu_model/part2 /tmp/rfmodel/ && ls -la /tmp/rfmodel/*
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu.txt; cat $OUT/gpu.txt
T=$PWD/.gpulead/.gpu_assets/tokenizer
export RADIXFLOW_TOKENIZER=$T
echo "== $(date +%T) bench"
timeout 570 python3 benchmarks/gpu_bench.py --out $OUT/b --tokenizer $T --offline-warmup 64 --sections offline,offline@fp8,offline@fp8kv8 --deadline-s 420 > $OUT/b.log 2>&1; echo rc $?
grep -A8 "==== summary" $OUT/b.log | cut -c1-600
echo "== $(date +%T) end"
