#!/bin/bash
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/wh .whl/*.whl > /dev/null 2>&1 || exit 1
export RADIXFLOW_TOKENIZER=$PWD/.gpu_assets/tokenizer
cd tree; export PYTHONPATH=$PWD:/tmp/wh
python3 benchmarks/gpu_bench.py --out $OUT/pyt --tokenizer ../.gpu_assets/tokenizer --pytest-timeout 190 --sections pytest 2>&1 | grep -v "WARNING\|frozen" | tail -3
grep -E "FAILED|passed|failed" $OUT/pyt/pytest_gpu.log | tail -12
