#!/bin/bash
# Session 12 task A (gve): auto's one-model-call rule on / off in one engine (one_call_ab.py), then step timelines (rule off).
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/wh .whl/*.whl > /dev/null 2>&1 || exit 1
cd tree
export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/../.gpu_assets/tokenizer PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/smi.csv
echo "== ab $(date +%T)"
timeout 270 python3 one_call_ab.py --device cuda --config benchmarks/configs/llama3-8b.json --load-format dummy --tokenizer ../.gpu_assets/tokenizer --max-total-tokens 400000 --workloads mmlu,hellaswag,json_decode,generative_agents --timeline json_decode,mmlu --deadline-s 170 --json $OUT/ab.json > $OUT/ab_log.txt 2>&1; echo rc=$?
grep -v "Warn\|warn" $OUT/ab_log.txt | tail -40
echo "== end $(date +%T)"
