#!/bin/bash
# The lead's session-11 call 3 (right after call 2, warm): the mends' GPU tests, offline bf16 with and without the norm fold, FP8 attention at 4 / 1 KV heads.
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/wh .whl/*.whl || exit 1
cd tree
export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/../.gpu_assets/tokenizer
mkdir -p $OUT/tests $OUT/offline $OUT/fp8kv
echo "== gpu tests $(date +%T)"
timeout 150 python3 -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/test_gemv_epilogue_engine.py tests/test_gemv_epilogue.py > $OUT/tests/epilogue.txt 2>&1; echo rc=$?; tail -15 $OUT/tests/epilogue.txt
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_decode_entries.py tests/test_fp8_attention.py -k "gpu_fp8 or log2" > $OUT/tests/fp8attn.txt 2>&1; echo rc=$?; tail -8 $OUT/tests/fp8attn.txt
echo "== fp8 kv heads $(date +%T)"
for h in 4 1; do timeout 20 python3 benchmarks/fp8_attn_bench.py --kv-heads $h --out $OUT/fp8kv/h$h --cases 256xU,512x1536 --variants '^$' --jobs 14 > $OUT/fp8kv/h$h.log 2>&1; echo rc=$?; tail -5 $OUT/fp8kv/h$h.log; done
echo "== offline fold A/B $(date +%T)"
timeout 170 python3 benchmarks/gpu_bench.py --out $OUT/offline --tokenizer ../.gpu_assets/tokenizer --offline-seeds 2024 --offline-warmup 64 --sections offline@nofold,offline > $OUT/offline/log.txt 2>&1; echo rc=$?; grep -o '"seed2024": {"s": [0-9.]*, "out_tokens": [0-9]*, "out_tok_s": [0-9.]*\|"extend_gpu_s": [0-9.]*\|"decode_gpu_s": [0-9.]*' $OUT/offline/log.txt | tail -12
echo "== end $(date +%T)"
