set -x
python3 -m pip install -q --no-deps --no-index --target /tmp/wh .gpulead/.whl/*.whl 2>&1 | tail -2
cd .gpulead/tree && export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/../.gpu_assets/tokenizer
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv
T=../.gpu_assets/tokenizer
python3 benchmarks/gpu_bench.py --tokenizer $T --out $OUT/bf16 --sizes prof_n=800,prof_len=600,prof_out=32 --sections step_profile,decode_graphs,memory --deadline-s 200 > $OUT/bf16.log 2>&1
tail -5 $OUT/bf16.log
python3 benchmarks/gpu_bench.py --tokenizer $T --out $OUT/fp8 --sizes prof_n=800,prof_len=1200,prof_out=32 --sections step_profile@fp8kv8,decode_graphs@fp8kv8,memory@fp8kv8 --deadline-s 200 > $OUT/fp8.log 2>&1
tail -5 $OUT/fp8.log
grep -h "KV pool" $OUT/*.log
