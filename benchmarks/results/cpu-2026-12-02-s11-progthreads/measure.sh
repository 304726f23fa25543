#!/bin/bash
S=/work/wt/progthreads/benchmarks/results/cpu-2026-12-02-s11-progthreads/thread_cpu.py
for i in 1 2 3; do
  if [ $((i % 2)) -eq 1 ]; then order="base new"; else order="new base"; fi
  for t in $order; do
    if [ $t = base ]; then d=/tmp/pt/base; else d=/tmp/pt/new; fi
    echo "== $t run $i $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    (cd $d && PYTHONPATH=$d /work/main/.venv/bin/python $S --rounds 2 --json /tmp/pt/m_${t}_$i.json 2>&1 | grep -v Warn)
  done
done
echo done $(date +%T)
