#!/bin/bash
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/wh .whl/*.whl > /dev/null 2>&1 || exit 1
cd tree
export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/../.gpu_assets/tokenizer
timeout 150 python3 diag_fold.py 2>&1 | grep -v "WARNING\|frozen" | tail -20
