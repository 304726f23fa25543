#!/bin/bash
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/wh .whl/*.whl > /dev/null 2>&1 || exit 1
export RADIXFLOW_TOKENIZER=$PWD/.gpu_assets/tokenizer
cd treeM; export PYTHONPATH=$PWD:/tmp/wh
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
python3 benchmarks/gpu_bench.py --out $OUT/pf --tokenizer ../.gpu_assets/tokenizer --deadline-s 200 --sections matmul_rate,prefill,prefill_profile 2>&1 | grep -v "WARNING\|frozen" | grep -v "^\[" | tail -12
timeout 80 python3 benchmarks/gemm_sustained.py --seconds 15 --layer-seconds 15 --json $OUT/gemm_sustained.json 2>&1 | tail -8
python3 benchmarks/gpu_bench.py --out $OUT/pyt --tokenizer ../.gpu_assets/tokenizer --pytest-timeout 200 --sections pytest 2>&1 | grep -v "WARNING\|frozen" | tail -5
tail -5 $OUT/pyt/pytest_gpu.log
