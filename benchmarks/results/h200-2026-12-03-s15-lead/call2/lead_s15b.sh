python3 -m pip install -q --no-deps --no-index --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
cd .gpulead/tree && export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/../.gpu_assets/tokenizer
T=../.gpu_assets/tokenizer
date
timeout 340 python3 benchmarks/gpu_bench.py --tokenizer $T --out $OUT/b95 --mem-fraction-static 0.95 --offline-seeds 2024 --offline-warmup 64 --deadline-s 250 --sections logprob_peak,memory,offline,offline@fp8kv8,memory@fp8kv8,logprob_peak@fp8kv8 > $OUT/b95.log 2>&1
grep -A8 "==== summary" $OUT/b95.log | cut -c1-900
date
timeout 170 python3 benchmarks/gpu_bench.py --tokenizer $T --out $OUT/b85 --offline-seeds 2024 --offline-warmup 64 --sections offline,memory > $OUT/b85.log 2>&1
grep -A4 "==== summary" $OUT/b85.log | cut -c1-900
date
