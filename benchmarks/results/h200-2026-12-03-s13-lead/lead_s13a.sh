#!/bin/bash
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/wh .whl/*.whl > /dev/null 2>&1 || exit 1
cd tree
export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/../.gpu_assets/tokenizer
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv
python3 benchmarks/gpu_bench.py --out $OUT/adm --tokenizer ../.gpu_assets/tokenizer --offline-seeds 2024,7,99 --offline-warmup 64 --deadline-s 520 \
  --sections offline_1k@fp8kv8,offline_1k@fp8kv8ratio,offline,offline@ratio 2>&1 | grep -v "WARNING\|frozen" | tail -60
