#!/bin/bash
# Task C (issue 28, session 12) call 1: where prefill 8 x 2,048 spends its time, folded and unfolded; the
# SiLU-and-mul kernels alone (plain, interleaved new, interleaved old); attention candidates.
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/wh .whl/*.whl > /dev/null 2>&1 || exit 1
cd tree
export PYTHONPATH=$PWD:/tmp/wh PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,clocks.mem,temperature.gpu,power.limit --format=csv
timeout 165 python3 benchmarks/gpu_bench.py --out $OUT --tokenizer ../.gpu_assets/tokenizer --graph-max-bs 1 --deadline-s 120 \
  --sections matmul_rate,prefill_kernels,prefill_profile,prefill_profile@nofold,prefill_attention > $OUT/log.txt 2>&1; echo rc=$?
grep -v "frozen\|WARNING" $OUT/log.txt | tail -c 9000
