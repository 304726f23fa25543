# Session 35, call A (H200 asked): issue 28's table part 1: ceilings and batch 1 (bf16, FP8) at the default memory
# fraction (the bandwidth probe needs the room), then prefill 8 x 2,048 and the 1,000 in / 1,000 out workload
# (FP8 weights + FP8 KV) at --mem-fraction-static 0.95. Also stashes the GGUF's first part in /tmp for call B.
source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
export PYTHONUNBUFFERED=1
mkdir -p $OUT /tmp/rfmodel; cp .gpulead/lead_s35a.sh $OUT/
cp -r .gpu_model/part1 /tmp/rfmodel/ && ls -la /tmp/rfmodel/part1 || exit 4
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu.txt; cat $OUT/gpu.txt
T=$PWD/.gpulead/.gpu_assets/tokenizer
export RADIXFLOW_TOKENIZER=$T
echo "== $(date +%T) bench a1"
timeout 250 python3 benchmarks/gpu_bench.py --out $OUT/a1 --tokenizer $T --sections ceilings,bs1,bs1@fp8 --deadline-s 200 > $OUT/a1.log 2>&1; echo rc $?
grep -A8 "==== summary" $OUT/a1.log | cut -c1-400
echo "== $(date +%T) bench a2"
timeout 300 python3 benchmarks/gpu_bench.py --out $OUT/a2 --tokenizer $T --mem-fraction-static 0.95 --sections prefill,offline_1k@fp8kv8 --deadline-s 200 > $OUT/a2.log 2>&1; echo rc $?
grep -A8 "==== summary" $OUT/a2.log | cut -c1-400
echo "== $(date +%T) end"
