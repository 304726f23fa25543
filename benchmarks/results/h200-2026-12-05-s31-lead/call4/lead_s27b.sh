# Session 27, call 2: the programs suite, A/B: session 25's start tree (236ce32, in .gpulead/base) and HEAD, then
# HEAD with mixed passes (--enable-mixed-chunk). One run each (~240 s; the call's limit allows two, a third if time).
source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
export PYTHONUNBUFFERED=1
export RADIXFLOW_TOKENIZER=$PWD/.gpulead/.gpu_assets/tokenizer
T=$RADIXFLOW_TOKENIZER
M="--config benchmarks/configs/llama3-8b.json --load-format dummy --tokenizer $T --max-total-tokens 400000"
S="--n 64 --size 1.0 --repeats 2 --baseline-repeats 1 --min-round-s 0.5 --deadline-s ${DEADLINE:-170}"
mkdir -p $OUT; cp .gpulead/lead_s27b.sh $OUT/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu.txt
for arm in ${ARMS:-base head}; do
  echo "== $(date +%T) $arm"
  d=$PWD; x=""; [ $arm = base ] && d=$PWD/.gpulead/base; [ $arm = mixed ] && x=--enable-mixed-chunk
  (cd $d && PYTHONPATH=$d:/tmp/site timeout 245 python3 benchmarks/programs/run.py --device cuda $M $S $x --json $OUT/$arm.json > $OUT/$arm.log 2>&1; echo rc $?)
  grep "Geometric" $OUT/$arm.log | tail -1 | cut -c1-200
done
echo "== $(date +%T) end"
