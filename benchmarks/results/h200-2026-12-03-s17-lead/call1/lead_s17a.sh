python3 -m pip install -q --no-deps --no-index --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
cd .gpulead/tree && export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/../.gpu_assets/tokenizer
T=$PWD/../.gpu_assets/tokenizer
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv,noheader -lms 250 > $OUT/smi.csv 2>&1 &
SMI=$!
mark() { echo "$(date +%H:%M:%S.%N) $*" >> $OUT/marks.txt; echo "== $(date +%T) $*"; }
mark timeline
timeout 170 python3 benchmarks/programs/step_timeline.py --device cuda --config benchmarks/configs/llama3-8b.json --load-format dummy --tokenizer $T --n 64 --size 1.0 --max-total-tokens 400000 --workloads mmlu,hellaswag,react,generative_agents,tree_of_thought,skeleton_of_thought,llm_judge,json_decode,multi_turn_chat,dspy_rag --json $OUT/timeline.json > $OUT/timeline.log 2>&1
echo rc $?; grep "^|" $OUT/timeline.log
mark host_profile
timeout 120 python3 benchmarks/programs/host_profile.py --config benchmarks/configs/llama3-8b.json --load-format dummy --max-total-tokens 400000 --n 64 --size 1.0 --workloads hellaswag,tree_of_thought,mmlu,llm_judge,react --top 30 > $OUT/host_profile.log 2>&1
echo rc $?; grep "^## " $OUT/host_profile.log
for lay in contiguous random; do
  mark attn_$lay
  timeout 80 python3 benchmarks/attn_in_step.py --layout $lay --seconds 2.5 --out $OUT 2>&1 | tail -8
done
mark step_profile
timeout 150 python3 benchmarks/gpu_bench.py --tokenizer $T --out $OUT/fp8 --mem-fraction-static 0.95 --sizes prof_n=1000,prof_len=1500,prof_out=16 --sections step_profile@fp8kv8 --deadline-s 140 > $OUT/fp8.log 2>&1
echo rc $?; tail -30 $OUT/fp8.log
mark end
kill $SMI
