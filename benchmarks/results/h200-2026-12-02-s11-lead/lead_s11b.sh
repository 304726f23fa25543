#!/bin/bash
# The lead's session-11 call 2 on merged main: the programs suite (extend graphs default) and batch 1 (bf16, FP8) with the deterministic epilogue sum.
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/wh .whl/*.whl || exit 1
cd tree
export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/../.gpu_assets/tokenizer
mkdir -p $OUT/programs $OUT/bs1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/smi.csv
echo "== bs1 $(date +%T)"
timeout 130 python3 benchmarks/gpu_bench.py --out $OUT/bs1 --tokenizer ../.gpu_assets/tokenizer --graph-max-bs 8 --sections ceilings,bs1,bs1@fp8 > $OUT/bs1/log.txt 2>&1; echo rc=$?; grep -v decode_steps $OUT/bs1/log.txt | tail -12 | cut -c1-700
echo "== programs $(date +%T)"
timeout 330 python3 benchmarks/programs/run.py --device cuda --config benchmarks/configs/llama3-8b.json --load-format dummy --tokenizer ../.gpu_assets/tokenizer --n 64 --size 1.0 --repeats 2 --baseline-repeats 1 --min-round-s 0.5 --max-total-tokens 400000 --deadline-s 250 --json $OUT/programs/s11_lead_programs.json > $OUT/programs/log.txt 2>&1; echo rc=$?; tail -70 $OUT/programs/log.txt
echo "== end $(date +%T)"
