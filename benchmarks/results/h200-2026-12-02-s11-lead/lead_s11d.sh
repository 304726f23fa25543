#!/bin/bash
# The lead's session-11 call 4: the GEMV epilogue engine tests with the tokenizer from RADIXFLOW_TOKENIZER (call 3 found the default model missing there).
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/wh .whl/*.whl > /dev/null 2>&1 || exit 1
cd tree
export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/../.gpu_assets/tokenizer
timeout 150 python3 -m pytest -q -m gpu -n 3 -p no:cacheprovider tests/test_gemv_epilogue_engine.py 2>&1 | grep -v "WARNING\|frozen" | tail -25
