#!/bin/bash
OUT=/work/wt-e/benchmarks/results/cpu-2026-12-02-s10-host-time
PY=/work/main/.venv/bin/python
WL=react,llm_judge,tree_of_thought,hellaswag,mmlu
for i in 2 3 4; do
  for tree in new base; do
    if [ $i = 2 ] && [ $tree = base ]; then continue; fi
    if [ $tree = base ]; then dir=/tmp/e/base; else dir=/work/wt-e; fi
    cd $dir
    echo "$(date -u +%T) timeline $i $tree load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/log.txt
    PYTHONPATH=$dir timeout 900 $PY benchmarks/programs/step_timeline.py --config benchmarks/configs/smollm2-tiny.json \
      --load-format dummy --n 64 --size 1.0 --workloads $WL --stand-in-model --max-total-tokens 800000 \
      --json $OUT/standin_${tree}_$i.json > /dev/null 2>> $OUT/stderr.txt
  done
done
echo "$(date -u +%T) done" >> $OUT/log.txt
