#!/bin/bash
# The lead's session-10 call 1 on merged main (+ mend 2's run.py): the programs suite, extend graphs default vs 0, like for like.
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/wh .whl/*.whl || exit 1
cd tree
export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/../.gpu_assets/tokenizer
mkdir -p $OUT/programs
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/smi.csv
echo "== programs $(date +%T)"
timeout 370 python3 benchmarks/programs/run.py --device cuda --config benchmarks/configs/llama3-8b.json --load-format dummy --tokenizer ../.gpu_assets/tokenizer --n 64 --size 1.0 --repeats 2 --baseline-repeats 1 --min-round-s 0.5 --max-total-tokens 400000 --extend-graph-tokens default,0 --deadline-s 300 --json $OUT/programs/s10_lead_programs.json > $OUT/programs/log.txt 2>&1; echo rc=$?; tail -60 $OUT/programs/log.txt
echo "== end $(date +%T)"
