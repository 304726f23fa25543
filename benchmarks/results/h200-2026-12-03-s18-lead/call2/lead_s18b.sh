python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/wh PYTHONUNBUFFERED=1
export RADIXFLOW_TOKENIZER=$PWD/.gpulead/.gpu_assets/tokenizer
T=$RADIXFLOW_TOKENIZER
M="--config benchmarks/configs/llama3-8b.json --load-format dummy --tokenizer $T --max-total-tokens 400000"
mkdir -p $OUT
echo "== $(date +%T) syncs"
timeout 120 python3 benchmarks/programs/step_timeline.py --device cuda $M --n 64 --size 1.0 --workloads hellaswag,react,tree_of_thought --syncs --json $OUT/timeline.json > $OUT/timeline.log 2>&1; echo rc $?
grep -v "WARNING\|frozen\|^| ---" $OUT/timeline.log | tail -50
echo "== $(date +%T) profile"
timeout 200 python3 benchmarks/programs/host_profile.py $M --n 64 --size 1.0 --workloads llm_judge,generative_agents,react,skeleton_of_thought --mode graph --top 25 > $OUT/profile.txt 2>&1; echo rc $?
grep -B2 -A 22 "engine threads by tottime" $OUT/profile.txt | cut -c1-150 | head -110
echo "== $(date +%T) end"
