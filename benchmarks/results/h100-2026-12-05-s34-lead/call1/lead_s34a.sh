# Session 34, call A (H200): issue 28's table part 1: ceilings, batch 1 (bf16, FP8), prefill 8 x 2,048, and the
# 1,000 in / 1,000 out workload (FP8 weights + FP8 KV, --mem-fraction-static 0.95), one run each.
source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
export PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .gpulead/lead_s34a.sh $OUT/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu.txt; cat $OUT/gpu.txt
T=$PWD/.gpulead/.gpu_assets/tokenizer
export RADIXFLOW_TOKENIZER=$T
echo "== $(date +%T) bench"
timeout 560 python3 benchmarks/gpu_bench.py --out $OUT/a --tokenizer $T --mem-fraction-static 0.95 --sections ceilings,bs1,bs1@fp8,prefill,offline_1k@fp8kv8 --deadline-s 520 > $OUT/a.log 2>&1; echo rc $?
tail -45 $OUT/a.log
echo "== $(date +%T) end"
