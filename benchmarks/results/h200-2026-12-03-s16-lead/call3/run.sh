python3 -m pip install -q --no-deps --no-index --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
cd .gpulead/tree && export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/../.gpu_assets/tokenizer
T=../.gpu_assets/tokenizer
date
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_decode_entries.py -k "gpu or large" 2>&1 | tail -3
timeout 100 python3 benchmarks/fp8_attn_bench.py --out $OUT/sweep1w --cases 1000x1500,768xU,512x1536,384xU --variants 'w1s' > $OUT/sweep1w.log 2>&1
echo "sweep rc $?"; grep -E "^(1000x1500|768xU|512x1536|384xU):|best" $OUT/sweep1w.log | cut -c1-330
cp radixflow/kernels/decode_config.py /tmp/dc.py
sed -i 's/,\n *"large": {[^}]*}//' radixflow/kernels/decode_config.py
python3 - <<'PY'
import re
p='radixflow/kernels/decode_config.py'; s=open(p).read()
s2=re.sub(r',\s*"large": \{[^{}]*\}', '', s, count=1); assert s2 != s; open(p,'w').write(s2)
PY
grep -c '"large": {"min' radixflow/kernels/decode_config.py
date
timeout 185 python3 benchmarks/gpu_bench.py --tokenizer $T --out $OUT/armA --mem-fraction-static 0.95 --offline-seeds 2024 --offline-warmup 64 --sections offline_1k@fp8kv8,offline@fp8kv8 > $OUT/armA.log 2>&1
grep -A3 "==== summary" $OUT/armA.log | cut -c1-420
cp /tmp/dc.py radixflow/kernels/decode_config.py; grep -c '"large": {"min' radixflow/kernels/decode_config.py
date
timeout 185 python3 benchmarks/gpu_bench.py --tokenizer $T --out $OUT/armB --mem-fraction-static 0.95 --offline-seeds 2024 --offline-warmup 64 --sections offline_1k@fp8kv8,offline@fp8kv8 > $OUT/armB.log 2>&1
grep -A3 "==== summary" $OUT/armB.log | cut -c1-420
date
