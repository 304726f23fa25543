python3 -m pip install -q --no-deps --no-index --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
cd .gpulead/tree && export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/../.gpu_assets/tokenizer
T=../.gpu_assets/tokenizer
date
grep -n '"fp8": {"block_n"' radixflow/kernels/decode_attention.py
timeout 185 python3 benchmarks/gpu_bench.py --tokenizer $T --out $OUT/n64 --mem-fraction-static 0.95 --offline-seeds 2024 --offline-warmup 64 --sections offline_1k@fp8kv8,offline@fp8kv8 > $OUT/n64.log 2>&1
grep -A3 "==== summary" $OUT/n64.log | cut -c1-420
sed -i 's/"fp8": {"block_n": 64, "num_warps": 2, "num_stages": 5,/"fp8": {"block_n": 32, "num_warps": 1, "num_stages": 5,/' radixflow/kernels/decode_attention.py
grep -n '"fp8": {"block_n"' radixflow/kernels/decode_attention.py
date
timeout 185 python3 benchmarks/gpu_bench.py --tokenizer $T --out $OUT/n32 --mem-fraction-static 0.95 --offline-seeds 2024 --offline-warmup 64 --sections offline_1k@fp8kv8,offline@fp8kv8 > $OUT/n32.log 2>&1
grep -A3 "==== summary" $OUT/n32.log | cut -c1-420
date
