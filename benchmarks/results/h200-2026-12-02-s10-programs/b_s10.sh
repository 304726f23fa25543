#!/bin/bash
# Task B, session 10 (issue 29): extend-graph GPU tests, then the programs suite with the default extend graphs and without.
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/wh .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/.gpu_assets/tokenizer
mkdir -p $OUT/tests $OUT/programs
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/smi.csv
git_commit=$(cat COMMIT 2>/dev/null); echo "commit $git_commit"
echo "== tests $(date +%T) ${SECONDS}s"
timeout 75 python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/test_extend_graphs.py > $OUT/tests/pytest.txt 2>&1
echo "rc=$?"; grep -a "extend graphs \|passed\|failed\|Error\|assert" $OUT/tests/pytest.txt | tail -20
echo "== programs $(date +%T) ${SECONDS}s"
timeout $((312 - SECONDS)) python3 benchmarks/programs/run.py --device cuda --config benchmarks/configs/llama3-8b.json \
  --load-format dummy --tokenizer .gpu_assets/tokenizer --n 64 --size 1.0 --repeats 2 --baseline-repeats 1 \
  --min-round-s 0.5 --max-total-tokens 400000 --extend-graph-tokens default,0 --later-modes graph --deadline-s 150 \
  --json $OUT/programs/s10_programs.json > $OUT/programs/log.txt 2>&1
echo "rc=$?"; grep -v "^|" $OUT/programs/log.txt | tail -30; tail -14 $OUT/programs/log.txt
echo "== end $(date +%T) ${SECONDS}s"
