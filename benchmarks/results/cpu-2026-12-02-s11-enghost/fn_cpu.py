"""Engine-thread CPU (time.thread_time) inside the functions this session changed, one graph round a
workload after a warm-up: on_step (the executor), _wake (the stepper's waiter checks), admission's
matches and fresh_enough, and the whole step. Tiny config, stand-in model, 64 programs, size 1.0.
From a tree's root: PYTHONPATH=$PWD python <this file> workload,workload,...
"""
import os, sys, random, time, collections
root = os.getcwd()
sys.path.insert(0, os.path.join(root, "benchmarks/programs"))
import radixflow as rf
from radixflow.runtime.scheduling import admission
from run import run_mode
from step_timeline import stand_in_forward
from workloads import BY_NAME
wls = sys.argv[1].split(",")
mode = sys.argv[2] if len(sys.argv) > 2 else "graph"
stats = collections.defaultdict(lambda: [0, 0.0])
def timed(obj, name, key):
    fn = getattr(obj, name)
    def w(*a, **k):
        t = time.thread_time()
        try: return fn(*a, **k)
        finally:
            s = stats[key]; s[0] += 1; s[1] += time.thread_time() - t
    setattr(obj, name, w)
sampling = {"max_new_tokens": 8, "temperature": 0}
with rf.Engine("benchmarks/configs/smollm2-tiny.json", load_format="dummy", max_total_tokens=800000) as engine:
    stand_in_forward(engine)
    timed(admission, "fresh_enough", "fresh_enough")
    timed(admission, "ordered_waiting", "ordered_waiting")
    timed(engine.scheduler.kv, "match", "kv.match")
    timed(engine.scheduler.kv, "admit", "kv.admit")
    if hasattr(engine.scheduler.kv, "match_waiting"): timed(engine.scheduler.kv, "match_waiting", "kv.match_waiting")
    timed(engine.scheduler.kv, "alloc", "kv.alloc")
    timed(admission, "form_extend_batch", "form_extend_batch")
    import radixflow.runtime.scheduling.scheduler as sm
    sm.form_extend_batch = admission.form_extend_batch
    timed(engine.programs, "on_step", "on_step")
    timed(engine.stepper, "_wake", "_wake")
    timed(engine.scheduler, "step", "step")
    for name in wls:
        w = BY_NAME[name]
        inputs = w.inputs(random.Random(0), 64, 1.0)
        run_mode(engine, w, inputs, mode, sampling)
        stats.clear()
        t = time.perf_counter()
        r = run_mode(engine, w, inputs, mode, sampling)
        wall = time.perf_counter() - t
        print(f"{name}: wall {wall:.3f} steps {r['scheduler_steps']} " + ", ".join(f"{k} {v[0]}x {1000*v[1]:.1f}ms" for k, v in stats.items()), flush=True)
