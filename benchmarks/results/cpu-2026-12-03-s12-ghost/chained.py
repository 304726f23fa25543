"""Graph rounds with overlap forced on (as on CUDA), stand-in model: forward steps and chained (overlapped) decode steps a round.
PYTHONPATH=$PWD python chained.py wl,wl"""
import os, sys, random, json
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks/programs"))
import radixflow as rf
from run import run_mode
from step_timeline import stand_in_forward
from workloads import BY_NAME
sampling = {"max_new_tokens": 8, "temperature": 0}
out = {}
with rf.Engine("benchmarks/configs/smollm2-tiny.json", load_format="dummy", max_total_tokens=800000) as engine:
    stand_in_forward(engine)
    s = engine.scheduler
    s.overlap = True
    for name in sys.argv[1].split(","):
        w = BY_NAME[name]
        inputs = w.inputs(random.Random(0), 64, 1.0)
        run_mode(engine, w, inputs, "graph", sampling)
        st = s.stats
        a = (st.forward_steps, st.chained_decode_steps, st.split_decode_steps)
        r = run_mode(engine, w, inputs, "graph", sampling)
        b = (st.forward_steps, st.chained_decode_steps, st.split_decode_steps)
        out[name] = {"steps": b[0] - a[0], "chained": b[1] - a[1], "split": b[2] - a[2]}
        print(name, out[name], flush=True)
print(json.dumps(out))
