python3 -m pip install -q --no-deps --no-index --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
export RADIXFLOW_TOKENIZER=$PWD/.gpulead/.gpu_assets/tokenizer
T=$RADIXFLOW_TOKENIZER
mkdir -p $OUT/programs
(cd .gpulead/tree && PYTHONPATH=$PWD:/tmp/wh timeout 60 python3 -m pytest -q -x -p no:cacheprovider tests/test_radix_cache.py -k "gpu or flush" 2>&1 | tail -2)
for t in treeB tree; do
  echo "== $(date +%T) $t"
  (cd .gpulead/$t && PYTHONPATH=$PWD:/tmp/wh timeout 232 python3 benchmarks/programs/run.py --device cuda --config benchmarks/configs/llama3-8b.json --load-format dummy --tokenizer $T --n 64 --size 1.0 --repeats 2 --baseline-repeats 1 --min-round-s 0.5 --max-total-tokens 400000 --deadline-s 180 --json $OUT/programs/$t.json > $OUT/programs/$t.log 2>&1; echo rc $?; grep -v "WARNING\|frozen" $OUT/programs/$t.log | tail -14)
done
echo "== $(date +%T) end"
