python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/wh PYTHONUNBUFFERED=1
export RADIXFLOW_TOKENIZER=$PWD/.gpulead/.gpu_assets/tokenizer
T=$RADIXFLOW_TOKENIZER
M="--config benchmarks/configs/llama3-8b.json --load-format dummy --tokenizer $T --max-total-tokens 400000"
mkdir -p $OUT
cp .gpulead/lead_s19a.sh $OUT/
echo "== $(date +%T) timeline"
timeout 280 python3 benchmarks/programs/step_timeline.py --device cuda $M --n 64 --size 1.0 --workloads hellaswag,mmlu,json_decode --profile-forward --json $OUT/timeline.json > $OUT/timeline.log 2>&1; echo rc $?
grep "^| [a-z_]* | [ge]" $OUT/timeline.log
echo "== $(date +%T) end"
