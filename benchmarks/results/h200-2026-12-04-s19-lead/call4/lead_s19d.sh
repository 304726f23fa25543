python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/wh PYTHONUNBUFFERED=1
export RADIXFLOW_TOKENIZER=$PWD/.gpulead/.gpu_assets/tokenizer
T=$RADIXFLOW_TOKENIZER
M="--config benchmarks/configs/llama3-8b.json --load-format dummy --tokenizer $T --max-total-tokens 400000"
mkdir -p $OUT
cp .gpulead/lead_s19d.sh .gpulead/linear_launch.py $OUT/
echo "== $(date +%T) linear"
timeout 60 python3 .gpulead/linear_launch.py > $OUT/linear.log 2>&1; echo rc $?; cat $OUT/linear.log
for t in sw5 sw05; do
  echo "== $(date +%T) $t"
  X=""; [ $t = sw05 ] && X="--switch-interval-ms 0.5"
  timeout 225 python3 benchmarks/programs/run.py --device cuda $M --n 64 --size 1.0 --repeats 2 --baseline-repeats 1 --min-round-s 0.5 --deadline-s 180 $X --json $OUT/$t.json > $OUT/$t.log 2>&1; echo rc $?
  grep "Geometric\|^| [a-z_]* |" $OUT/$t.log | tail -12 | cut -c1-200
done
echo "== $(date +%T) end"
