#!/bin/bash
# The lead's session-11 call 1 on merged main cd62713 (tasks B, A, D): task D's graph / eager probe; offline bf16 vs FP8 + FP8 KV (seed 2024) and the 1k / 1k FP8 + FP8 KV workload.
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/wh .whl/*.whl || exit 1
cd tree
export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/../.gpu_assets/tokenizer
mkdir -p $OUT/probe $OUT/offline
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/smi.csv
echo "== probe ga $(date +%T)"
timeout 150 python3 benchmarks/programs/graph_eager_probe.py --device cuda --config benchmarks/configs/llama3-8b.json --load-format dummy --tokenizer ../.gpu_assets/tokenizer --max-total-tokens 400000 --workloads generative_agents,json_decode --settings default,default+feed --deadline-s 110 --json $OUT/probe/ga.json > $OUT/probe/ga_log.txt 2>&1; echo rc=$?; tail -45 $OUT/probe/ga_log.txt
echo "== probe mmlu $(date +%T)"
timeout 110 python3 benchmarks/programs/graph_eager_probe.py --device cuda --config benchmarks/configs/llama3-8b.json --load-format dummy --tokenizer ../.gpu_assets/tokenizer --max-total-tokens 400000 --workloads mmlu --settings 0,default --deadline-s 75 --json $OUT/probe/mmlu.json > $OUT/probe/mmlu_log.txt 2>&1; echo rc=$?; tail -30 $OUT/probe/mmlu_log.txt
echo "== offline $(date +%T)"
timeout 280 python3 benchmarks/gpu_bench.py --out $OUT/offline --tokenizer ../.gpu_assets/tokenizer --offline-seeds 2024 --offline-warmup 64 --sections offline,offline@fp8kv8,offline_1k@fp8kv8 > $OUT/offline/log.txt 2>&1; echo rc=$?; tail -40 $OUT/offline/log.txt
echo "== end $(date +%T)"
