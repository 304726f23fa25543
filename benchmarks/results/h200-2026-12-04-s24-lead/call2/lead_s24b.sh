source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
export PYTHONUNBUFFERED=1
export RADIXFLOW_TOKENIZER=$PWD/.gpulead/.gpu_assets/tokenizer
T=$RADIXFLOW_TOKENIZER
M="--config benchmarks/configs/llama3-8b.json --load-format dummy --tokenizer $T --max-total-tokens 400000"
mkdir -p $OUT
cp .gpulead/lead_s24b.sh $OUT/
git log --oneline -1 > $OUT/rev.txt 2>/dev/null
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu.txt
for r in ${RUNS:-1}; do
  echo "== $(date +%T) run $r"
  timeout 250 python3 benchmarks/programs/run.py --device cuda $M --n 64 --size 1.0 --repeats 2 --baseline-repeats 1 --min-round-s 0.5 --deadline-s 180 --json $OUT/run$r.json > $OUT/run$r.log 2>&1; echo rc $?
  grep "Geometric\|compiled" $OUT/run$r.log | tail -4 | cut -c1-200
done
echo "== $(date +%T) end"
