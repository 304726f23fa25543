# Session 35, call C (call A/B's machine): the real default model's FP8 accuracy with the fast-accumulating FP8 GEMMs:
# FP8 weights and FP8 weights + FP8 KV against the bf16 engine, and the yardstick bf16 against float32, all Triton.
source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
export PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .gpulead/lead_s35c.sh $OUT/
ls -la /tmp/rfmodel/* .gpu_model/part3
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu.txt; cat $OUT/gpu.txt
P="--parts /tmp/rfmodel/part1 /tmp/rfmodel/part2 .gpu_model/part3 --backends triton,triton --dlogprob"
echo "== $(date +%T) fp8"
timeout 200 python3 benchmarks/gpu_real_model.py $P --out $OUT/fp8 --dtype bfloat16 --candidate-quantization fp8 > $OUT/fp8.log 2>&1; echo rc $?
tail -25 $OUT/fp8.log
echo "== $(date +%T) fp8kv8"
timeout 170 python3 benchmarks/gpu_real_model.py $P --out $OUT/fp8kv8 --dtype bfloat16 --candidate-quantization fp8 --candidate-kv-cache-dtype fp8_e4m3 > $OUT/fp8kv8.log 2>&1; echo rc $?
tail -25 $OUT/fp8kv8.log
echo "== $(date +%T) bf16 vs float32"
timeout 170 python3 benchmarks/gpu_real_model.py $P --out $OUT/bf16 --dtype float32 --candidate-dtype bfloat16 --tie-nats 0.05 > $OUT/bf16.log 2>&1; echo rc $?
tail -25 $OUT/bf16.log
echo "== $(date +%T) end"
