python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/wh
export RADIXFLOW_TOKENIZER=$PWD/.gpulead/.gpu_assets/tokenizer
T=$RADIXFLOW_TOKENIZER
mkdir -p $OUT
cp .gpulead/lead_s22e.sh $OUT/
echo "== $(date +%T) sweep"
timeout 200 python3 benchmarks/gpu_bench.py --tokenizer $T --out $OUT/b --sections decode_sweep --sweep-batches 1,16,64,128,200 --sizes prof_len=500,prof_out=32 --graph-max-bs 256 --max-running 256 --deadline-s 190 > $OUT/b.log 2>&1; echo rc $?
grep "cuBLASLt\|decode_sweep bs" $OUT/b.log | cut -c1-330
echo "== $(date +%T) end"
