python3 -m pip install -q --no-deps --no-index --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
cd .gpulead/tree && export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/../.gpu_assets/tokenizer
T=../.gpu_assets/tokenizer
date
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_fp8.py tests/test_kernels.py -k "quantizing_norms or graphs_share" 2>&1 | tail -3
date
timeout 170 python3 benchmarks/gpu_bench.py --tokenizer $T --out $OUT/off --offline-seeds 2024 --offline-warmup 64 --deadline-s 85 --sections offline@fp8kv8,offline > $OUT/off.log 2>&1
grep -A3 "==== summary" $OUT/off.log | cut -c1-500
date
