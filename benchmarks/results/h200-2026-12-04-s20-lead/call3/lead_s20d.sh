python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/wh
export RADIXFLOW_TOKENIZER=$PWD/.gpulead/.gpu_assets/tokenizer
T=$RADIXFLOW_TOKENIZER
M="--config benchmarks/configs/llama3-8b.json --load-format dummy --tokenizer $T --max-total-tokens 400000"
mkdir -p $OUT
cp .gpulead/lead_s20d.sh $OUT/
python3 -c "import triton, inspect; from triton.runtime.jit import JITFunction; print(triton.__version__, 'device_caches' in inspect.getsource(JITFunction))"
echo "== $(date +%T) tree"
timeout 240 python3 benchmarks/programs/run.py --device cuda $M --n 64 --size 1.0 --repeats 2 --baseline-repeats 1 --min-round-s 0.5 --deadline-s 180 --json $OUT/tree.json > $OUT/tree.log 2>&1; echo rc $?
grep "Geometric\|^| [a-z_]* |\|compiled" $OUT/tree.log | tail -24 | cut -c1-220
echo "== $(date +%T) gaps"
timeout 200 python3 benchmarks/programs/idle_gaps.py --device cuda $M --n 64 --size 1.0 --workloads hellaswag,react,mmlu,tree_of_thought --stacks --json $OUT/gaps.json > $OUT/gaps.log 2>&1; echo rc $?
echo "== $(date +%T) end"
