#!/bin/bash
# The lead's session-10 call 2 (warm): GPU tests, auto on every constrained cell, batch 1 with the GEMV-only bound.
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/wh .whl/*.whl || exit 1
cd tree
export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/../.gpu_assets/tokenizer
mkdir -p $OUT/tests $OUT/constrained $OUT/bs1
echo "== tests $(date +%T)"
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_extend_graphs.py tests/test_decode_entries.py 2>&1 | tail -12 | tee $OUT/tests/pytest_tail.txt
echo "== constrained $(date +%T)"
timeout 140 python3 benchmarks/constrained_gpu.py --tokenizer ../.gpu_assets/tokenizer --out $OUT/constrained --grammar-backends auto --idle-backends auto --sizes 256,64,1 --temps 0,1 --repeats 2 --sections correctness,idle,throughput --deadline-s 120 > $OUT/constrained/stdout.txt 2>&1; echo rc=$?; tail -32 $OUT/constrained/stdout.txt
echo "== bs1 $(date +%T)"
timeout 70 python3 benchmarks/gpu_bench.py --out $OUT/bs1 --tokenizer ../.gpu_assets/tokenizer --sections ceilings,bs1 > $OUT/bs1/log.txt 2>&1; echo rc=$?; tail -c 1500 $OUT/bs1/log.txt
echo "== end $(date +%T)"
