python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/wh PYTHONUNBUFFERED=1
export RADIXFLOW_TOKENIZER=$PWD/.gpulead/.gpu_assets/tokenizer
T=$RADIXFLOW_TOKENIZER
M="--config benchmarks/configs/llama3-8b.json --load-format dummy --tokenizer $T --max-total-tokens 400000"
mkdir -p $OUT
echo "== $(date +%T) timeline"
timeout 300 python3 benchmarks/programs/step_timeline.py --device cuda $M --n 64 --size 1.0 --workloads mmlu,hellaswag,react,generative_agents,tree_of_thought,skeleton_of_thought,llm_judge,json_decode,multi_turn_chat,dspy_rag --syncs --json $OUT/timeline.json > $OUT/timeline.log 2>&1; echo rc $?
grep "graph\|eager" $OUT/timeline.log | grep "^|"
grep -A3 '"syncs"' $OUT/timeline.log | grep -v '"event_waits"\|^--' 
echo "== $(date +%T) end"
