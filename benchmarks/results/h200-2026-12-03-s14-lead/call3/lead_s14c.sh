python3 -m pip install -q --no-deps --no-index --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
cd .gpulead/tree && export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/../.gpu_assets/tokenizer
T=../.gpu_assets/tokenizer
date
timeout 170 python3 benchmarks/gpu_bench.py --tokenizer $T --out $OUT/fp8 --sections offline_1k@fp8kv8,memory@fp8kv8 > $OUT/fp8.log 2>&1
grep -A3 "==== summary" $OUT/fp8.log | cut -c1-900
date
timeout 170 python3 benchmarks/gpu_bench.py --tokenizer $T --out $OUT/fp8m92 --mem-fraction-static 0.92 --sections offline_1k@fp8kv8,memory@fp8kv8 > $OUT/fp8m92.log 2>&1
grep -A3 "==== summary" $OUT/fp8m92.log | cut -c1-900
date
timeout 130 python3 benchmarks/gpu_bench.py --tokenizer $T --out $OUT/pre --sections matmul_rate,prefill@fp8,prefill@fp8nofq,prefill@fp8,prefill@fp8nofq > $OUT/pre.log 2>&1
grep -A6 "==== summary" $OUT/pre.log | cut -c1-600
grep -h "KV pool" $OUT/*.log
date
