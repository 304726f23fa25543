import os, random, sys
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks/programs"))
import radixflow as rf
from run import run_mode
from workloads import BY_NAME
name = sys.argv[1]; n = int(sys.argv[2])
with rf.Engine() as engine:
    sched = engine.scheduler
    log = []
    orig = sched._run_extend
    def run_extend(batch):
        log.append([(r.kv_len, k, len(r.origin_input_ids)) for r, k in batch])
        return orig(batch)
    w = BY_NAME[name]; inputs = w.inputs(random.Random(0), n, 0.15)
    s = {"max_new_tokens": 6, "temperature": 0}
    for mode in ("graph", "eager", "graph", "eager"):
        engine.flush_cache()
        run_mode(engine, w, inputs, mode, s)   # warm
        engine.flush_cache()
        sched._run_extend = run_extend; log.clear()
        r = run_mode(engine, w, inputs, mode, s)
        sched._run_extend = orig
        print(mode, "extend tokens", sum(k for p in log for _, k, _ in p), "passes", len(log), "fwd", r["forward_steps"], "decode", r["decode_tokens"])
        for p in log: print("   ", p)
