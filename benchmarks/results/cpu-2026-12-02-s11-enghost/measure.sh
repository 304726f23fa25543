#!/bin/bash
# Alternates the base tree (9bd6315, git archive in /tmp/enghost/base) and this branch: thread_cpu.py
# (per-thread CPU of 5 graph rounds a workload, all ten workloads), then step_timeline.py with the
# stand-in model (session 10's command). Pairs: base then new, $1 times.
OUT=/work/wt/enghost/benchmarks/results/cpu-2026-12-02-s11-enghost
PY=/work/main/.venv/bin/python
TOOL=$OUT/thread_cpu.py
for i in $(seq 1 ${1:-2}); do
  for tree in base new; do
    if [ $tree = base ]; then dir=/tmp/enghost/base; else dir=/work/wt/enghost; fi
    cd $dir
    echo "$(date -u +%T) thread_cpu $i $tree load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/log.txt
    PYTHONPATH=$dir timeout 900 $PY $TOOL --json $OUT/cpu_${tree}_$i.json > /dev/null 2>> $OUT/stderr.txt
    echo "$(date -u +%T) timeline $i $tree load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/log.txt
    PYTHONPATH=$dir timeout 900 $PY benchmarks/programs/step_timeline.py --config benchmarks/configs/smollm2-tiny.json \
      --load-format dummy --n 64 --size 1.0 --workloads react,llm_judge,tree_of_thought,hellaswag,mmlu --stand-in-model \
      --max-total-tokens 800000 --json $OUT/timeline_${tree}_$i.json > /dev/null 2>> $OUT/stderr.txt
  done
done
echo "$(date -u +%T) done" >> $OUT/log.txt
