#!/bin/bash
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/wh .whl/*.whl > /dev/null 2>&1 || exit 1
export RADIXFLOW_TOKENIZER=$PWD/.gpu_assets/tokenizer
mkdir -p $OUT/programs
(cd treeM && PYTHONPATH=$PWD:/tmp/wh timeout 70 python3 benchmarks/gemm_sustained.py --seconds 20 --json $OUT/gemm_sustained.json 2>&1 | tail -8)
for t in treeG treeM; do
  (cd $t && PYTHONPATH=$PWD:/tmp/wh timeout 255 python3 benchmarks/programs/run.py --device cuda --config benchmarks/configs/llama3-8b.json --load-format dummy --tokenizer ../.gpu_assets/tokenizer --n 64 --size 1.0 --repeats 2 --baseline-repeats 1 --min-round-s 0.5 --max-total-tokens 400000 --deadline-s 195 --json $OUT/programs/$t.json 2>&1 | grep -v "WARNING\|frozen" | tail -22)
done
