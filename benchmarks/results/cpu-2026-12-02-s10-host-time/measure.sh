#!/bin/bash
# Alternates the base tree (820c681) and this branch: run.py on the default model, then
# step_timeline.py with the stand-in model on the tiny config (H200-like sizes).
# As run: stopped after pair 2's run.py (too slow under load); then only the step_timeline command
# below ran, for "2 new", "3 new", "3 base", "4 new", "4 base" in that order (log.txt).
OUT=/work/wt-e/benchmarks/results/cpu-2026-12-02-s10-host-time
PY=/work/main/.venv/bin/python
WL=react,llm_judge,tree_of_thought,hellaswag,mmlu
for i in 1 2 3; do
  for tree in base new; do
    if [ $tree = base ]; then dir=/tmp/e/base; else dir=/work/wt-e; fi
    cd $dir
    echo "$(date -u +%T) run $i $tree load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/log.txt
    PYTHONPATH=$dir timeout 900 $PY benchmarks/programs/run.py --workloads $WL --n 8 --size 0.15 --max-new-tokens 6 \
      --json $OUT/default_${tree}_$i.json > /dev/null 2>> $OUT/stderr.txt
    echo "$(date -u +%T) timeline $i $tree load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/log.txt
    PYTHONPATH=$dir timeout 900 $PY benchmarks/programs/step_timeline.py --config benchmarks/configs/smollm2-tiny.json \
      --load-format dummy --n 64 --size 1.0 --workloads $WL --stand-in-model --max-total-tokens 800000 \
      --json $OUT/standin_${tree}_$i.json > /dev/null 2>> $OUT/stderr.txt
  done
done
echo "$(date -u +%T) done" >> $OUT/log.txt
