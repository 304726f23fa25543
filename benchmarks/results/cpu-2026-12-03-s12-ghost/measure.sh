#!/bin/bash
# Alternates base (994cf94, git archive in /tmp/ghost/base) and new (ccbabdb, git archive in /tmp/ghost/newtree):
# session 11 task C's thread_cpu.py
# (engine-thread and program-thread CPU of graph rounds, tiny config, stand-in model), $1 pairs.
OUT=${OUT:-/tmp/ghost/m}
mkdir -p $OUT
PY=/work/main/.venv/bin/python
WL=react,llm_judge,tree_of_thought,dspy_rag,generative_agents,skeleton_of_thought,multi_turn_chat
for i in $(seq ${2:-1} ${1:-3}); do
  for tree in base new; do
    if [ $tree = base ]; then dir=/tmp/ghost/base; else dir=/tmp/ghost/newtree; fi
    cd $dir
    echo "$(date -u +%T) $i $tree load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/log.txt
    PYTHONPATH=$dir timeout 900 $PY ${REPO:-/work/wt/ghost}/benchmarks/results/cpu-2026-12-02-s11-enghost/thread_cpu.py --workloads $WL --rounds 3 --json $OUT/cpu_${tree}_$i.json > /dev/null 2>> $OUT/stderr.txt
  done
done
echo "$(date -u +%T) done load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/log.txt
