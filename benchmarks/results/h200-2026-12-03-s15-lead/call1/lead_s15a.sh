python3 -m pip install -q --no-deps --no-index --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
cd .gpulead/tree && export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/../.gpu_assets/tokenizer
T=../.gpu_assets/tokenizer
date
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_fp8.py -k "quantizing_norms" 2>&1 | tail -3
date
timeout 200 python3 benchmarks/gpu_bench.py --tokenizer $T --out $OUT/a85 --sections logprob_peak,memory,offline_1k@fp8kv8,memory > $OUT/a85.log 2>&1
grep -A8 "==== summary" $OUT/a85.log | cut -c1-700
date
timeout 200 python3 benchmarks/gpu_bench.py --tokenizer $T --out $OUT/a95 --mem-fraction-static 0.95 --sections offline_1k@fp8kv8,memory,logprob_peak > $OUT/a95.log 2>&1
grep -A8 "==== summary" $OUT/a95.log | cut -c1-700
date
