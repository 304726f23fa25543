python3 -m pip install -q --no-deps --no-index --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
cd .gpulead/tree && export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/../.gpu_assets/tokenizer
T=../.gpu_assets/tokenizer
date
timeout 260 python3 benchmarks/fp8_attn_bench.py --out $OUT/sweep --cases 768xU,512x1536,256x1536 --variants 'w1|n128w2s5|n64w2s8' --write-config --jobs 14 > $OUT/sweep.log 2>&1
tail -30 $OUT/sweep.log | cut -c1-300
git diff --stat radixflow/kernels/decode_attention.py 2>/dev/null; grep -n '"fp8": {' radixflow/kernels/decode_attention.py | head -2
date
timeout 200 python3 benchmarks/gpu_bench.py --tokenizer $T --out $OUT/k95 --mem-fraction-static 0.95 --sections offline_1k@fp8kv8 > $OUT/k95.log 2>&1
grep -A3 "==== summary" $OUT/k95.log | cut -c1-600
date
