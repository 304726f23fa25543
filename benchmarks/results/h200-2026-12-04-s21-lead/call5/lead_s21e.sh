python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/wh
export RADIXFLOW_TOKENIZER=$PWD/.gpulead/.gpu_assets/tokenizer
T=$RADIXFLOW_TOKENIZER
M="--config benchmarks/configs/llama3-8b.json --load-format dummy --tokenizer $T --max-total-tokens 400000"
mkdir -p $OUT
cp .gpulead/lead_s21e.sh $OUT/
for mode in graph; do
  echo "== $(date +%T) $mode"
  timeout 230 python3 benchmarks/programs/mixed_pass_probe.py --device cuda $M --n 64 --size 1.0 --mode $mode --json $OUT/mixed_$mode.json > $OUT/mixed_$mode.log 2>&1; echo rc $?
  grep "^| " $OUT/mixed_$mode.log | cut -c1-200
done
echo "== $(date +%T) end"
