python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1
export RADIXFLOW_TOKENIZER=$PWD/.gpulead/.gpu_assets/tokenizer
T=$RADIXFLOW_TOKENIZER
M="--config benchmarks/configs/llama3-8b.json --load-format dummy --tokenizer $T --max-total-tokens 400000"
mkdir -p $OUT
cp .gpulead/lead_s22c.sh $OUT/
R=$PWD
for t in tree treeB; do
  echo "== $(date +%T) $t"
  d=$R/.gpulead/treeB; [ $t = tree ] && d=$R
  (cd $d && PYTHONPATH=$PWD:/tmp/wh timeout 240 python3 benchmarks/programs/run.py --device cuda $M --n 64 --size 1.0 --repeats 2 --baseline-repeats 1 --min-round-s 0.5 --deadline-s 180 --json $OUT/$t.json > $OUT/$t.log 2>&1; echo rc $?)
  grep "Geometric\|^| [a-z_]* |\|compiled\|cuBLASLt" $OUT/$t.log | tail -14 | cut -c1-200
done
echo "== $(date +%T) end"
