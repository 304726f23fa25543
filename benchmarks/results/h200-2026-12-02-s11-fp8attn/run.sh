#!/bin/bash
# Task B (issue 28, session 11): the FP8 KV decode attention sweep at the offline pass's shapes, then one
# offline pass (FP8 weights + FP8 KV, seed 2024) with the entry the sweep wrote, then the FP8 attention tests.
S=$(date +%s)
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/wh .whl/*.whl || exit 1
cd tree
export PYTHONPATH=$PWD:/tmp/wh PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,clocks.mem,temperature.gpu,power.limit --format=csv
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
mkdir -p $OUT/sweep $OUT/offline
echo "== sweep $(date +%T)"
timeout 135 python3 benchmarks/fp8_attn_bench.py --out $OUT/sweep --variants '^n' --write-config --jobs 14 > $OUT/sweep/log.txt 2>&1; echo rc=$?
tail -c 9000 $OUT/sweep/log.txt
grep -n '"fp8": {' radixflow/kernels/decode_attention.py | head -1
E=$(( $(date +%s) - S )); echo "elapsed $E"
if [ $E -lt 150 ]; then
  echo "== offline $(date +%T)"
  timeout $((224 - E)) python3 benchmarks/gpu_bench.py --out $OUT/offline --tokenizer ../.gpu_assets/tokenizer --sections offline@fp8kv8 --offline-seeds 2024 --offline-warmup 64 > $OUT/offline/log.txt 2>&1; echo rc=$?
  tail -c 2500 $OUT/offline/log.txt
fi
E=$(( $(date +%s) - S )); echo "elapsed $E"
if [ $E -lt 200 ]; then
  echo "== tests $(date +%T)"
  timeout $((226 - E)) python3 -m pytest -q -x -p no:cacheprovider tests/test_fp8_attention.py -k "gpu or loop_options" 2>&1 | tail -6
fi
echo "== end $(date +%T) elapsed $(( $(date +%s) - S ))"
