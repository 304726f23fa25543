# Session 28, call 1: K / V of an FP8 pool widened by integer operations (fp8_bits_k / fp8_bits_v): correct on the
# GPU (tests), then timed per layer call against the launches they modify (fp8_attn_bench).
source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
export PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .gpulead/lead_s28a.sh $OUT/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu.txt
echo "== $(date +%T) fp8 attention tests"
timeout 150 python3 -m pytest -q -x tests/test_fp8_attention.py > $OUT/pytest.txt 2>&1; echo rc $?; tail -2 $OUT/pytest.txt
echo "== $(date +%T) fp8_attn_bench"
timeout ${BENCH_S:-400} python3 benchmarks/fp8_attn_bench.py --out $OUT/attn --cases ${CASES:-1000x1500,768xU,256x1536} --variants '^n(32w1s5_e2(_r168)?$|64w2s5_e2$)|_b[kv]|_lz' > $OUT/attn.log 2>&1; echo rc $?
grep -E "^[0-9]+x[0-9U]+:|FAIL" $OUT/attn.log | cut -c1-300
rm -f $OUT/attn/cases.jsonl
echo "== $(date +%T) end"
