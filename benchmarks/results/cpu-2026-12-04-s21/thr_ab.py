"""CPU A/B of the in-batch prefix threshold: graph/eager and extend tokens, a few workloads, default model.
Ran on 55b223a, where the threshold was a module constant (patched below); from 033a767 on it is
ServerArgs.in_batch_prefix_threshold (Engine(in_batch_prefix_threshold=4)). Output: thr.log, one line a workload.
    python thr_ab.py tree_of_thought,dspy_rag,skeleton_of_thought 32   (then 4)"""
import os, random, sys, statistics, json
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks/programs"))
import radixflow as rf
from radixflow.runtime.scheduling import admission
thr = int(sys.argv[2])
admission.IN_BATCH_PREFIX_THRESHOLD = thr
admission.InBatchTails.DEPTH = max(thr, admission.SCORING_SHARE_MIN) + 1
import run as bench
res = bench.run_all  # noqa
with rf.Engine(max_total_tokens=16384) as engine:
    out = bench.run_all(engine, sys.argv[1].split(","), n=8, size=0.15, sampling={"max_new_tokens": 6, "temperature": 0},
                        repeats=3, min_round_s=1.0)
for k, x in out.items():
    g, e = x["graph"], x["eager"]
    print(thr, k, "graph/eager %.3f" % (g["throughput"] / e["throughput"]), "round ratios", x.get("graph_vs_eager"),
          "ext tokens", g["extend_tokens"], e["extend_tokens"], "passes", g["forward_steps"], e["forward_steps"], "model_s %.2f %.2f" % (g["model_s"], e["model_s"]))
