python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/wh
export RADIXFLOW_TOKENIZER=$PWD/.gpulead/.gpu_assets/tokenizer
T=$RADIXFLOW_TOKENIZER
M="--config benchmarks/configs/llama3-8b.json --load-format dummy --tokenizer $T --max-total-tokens 400000"
mkdir -p $OUT
cp .gpulead/lead_s21c.sh $OUT/
echo "== $(date +%T) tree"
timeout 240 python3 benchmarks/programs/run.py --device cuda $M --n 64 --size 1.0 --repeats 2 --baseline-repeats 1 --min-round-s 0.5 --deadline-s 180 --json $OUT/tree.json > $OUT/tree.log 2>&1; echo rc $?
grep "Geometric\|^| [a-z_]* |\|compiled\|extend graphs\|engine" $OUT/tree.log | tail -24 | cut -c1-220
echo "== $(date +%T) end"
echo "== $(date +%T) gaps"
timeout 200 python3 benchmarks/programs/idle_gaps.py --device cuda $M --n 64 --size 1.0 --json $OUT/gaps.json > $OUT/gaps.log 2>&1; echo rc $?
grep "^| [a-z_]* |" $OUT/gaps.log | sort -u | cut -c1-200
echo "== $(date +%T) end2"
