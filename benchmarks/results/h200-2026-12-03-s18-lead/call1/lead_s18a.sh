python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/wh PYTHONUNBUFFERED=1
export RADIXFLOW_TOKENIZER=$PWD/.gpulead/.gpu_assets/tokenizer
T=$RADIXFLOW_TOKENIZER
C="--device cuda --config benchmarks/configs/llama3-8b.json --load-format dummy --tokenizer $T --max-total-tokens 400000"
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
echo "== $(date +%T) syncs"
timeout 170 python3 benchmarks/programs/step_timeline.py $C --n 64 --size 1.0 --workloads hellaswag,react,tree_of_thought,llm_judge,mmlu --syncs --json $OUT/timeline.json > $OUT/timeline.log 2>&1; echo rc $?
grep -v "WARNING\|frozen" $OUT/timeline.log | tail -80
echo "== $(date +%T) suite"
timeout 300 python3 benchmarks/programs/run.py $C --n 64 --size 1.0 --repeats 2 --baseline-repeats 1 --min-round-s 0.5 --deadline-s 180 --json $OUT/tree.json > $OUT/tree.log 2>&1; echo rc $?
grep -v "WARNING\|frozen" $OUT/tree.log | tail -30
echo "== $(date +%T) end"
