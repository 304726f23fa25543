python3 -m pip install -q --no-deps --no-index --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
cd .gpulead/tree && export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/../.gpu_assets/tokenizer
T=../.gpu_assets/tokenizer
date
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_fp8.py -k "cuda_graph_decode or graphs_share or quantiz or fp8_gemm or takes" 2>&1 | tail -4
date
timeout 110 python3 benchmarks/gpu_bench.py --tokenizer $T --out $OUT/bf16 --sizes prof_n=1024,prof_len=300,prof_out=16 --sections decode_graphs,memory > $OUT/bf16.log 2>&1
grep -A3 "==== summary" $OUT/bf16.log | cut -c1-1500
date
timeout 330 python3 benchmarks/gpu_bench.py --tokenizer $T --out $OUT/fp8 --sections offline_1k@fp8kv8,memory@fp8kv8,offline_1k@fp8kv8nofq > $OUT/fp8.log 2>&1
grep -A4 "==== summary" $OUT/fp8.log | cut -c1-1000
grep -h "KV pool" $OUT/*.log
date
