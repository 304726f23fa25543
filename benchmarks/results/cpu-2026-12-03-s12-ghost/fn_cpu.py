"""Engine-thread CPU (thread_time) inside chosen functions, one unprofiled graph round per workload after warm-up.
PYTHONPATH=$PWD python fn_cpu.py wl,wl [mode] [rounds]"""
import os, sys, random, time, collections, statistics
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks/programs"))
import radixflow as rf
from radixflow.runtime.scheduling import admission, scheduler as sm, sampler as smp, overlap as ov, split_decode as sd
from run import run_mode
from step_timeline import stand_in_forward
from workloads import BY_NAME
wls = sys.argv[1].split(","); mode = sys.argv[2] if len(sys.argv) > 2 else "graph"; R = int(sys.argv[3]) if len(sys.argv) > 3 else 3
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
    s = engine.scheduler
    timed(admission, "form_extend_batch", "form_extend_batch"); sm.form_extend_batch = admission.form_extend_batch
    timed(admission, "fresh_enough", " fresh_enough")
    timed(s.kv, "match_waiting", " match_waiting")
    timed(s.kv, "admit", " kv.admit"); timed(s.kv, "alloc", " kv.alloc")
    timed(s, "_run_extend", "_run_extend")
    timed(s.kv, "cache_unfinished", " cache_unfinished")
    timed(s.logprobs, "add_inputs", " logprobs.add_inputs")
    timed(s, "_advance", "_advance"); timed(s.stops, "check", " stops.check"); timed(s, "_retire", " _retire")
    timed(s, "continue_request", " continue_request") if s.continue_request else None
    timed(s.runner, "forward", "MODEL forward")
    timed(smp, "greedy_ids", "MODEL argmax"); 
    timed(s, "sample", "sample")
    timed(s.kv, "alloc_decode", "alloc_decode")
    timed(engine.programs, "on_step", "on_step")
    timed(engine.stepper, "_wake", "_wake")
    timed(s, "step", "STEP")
    for name in wls:
        w = BY_NAME[name]
        inputs = w.inputs(random.Random(0), 64, 1.0)
        run_mode(engine, w, inputs, mode, sampling)
        acc = collections.defaultdict(list)
        for _ in range(R):
            stats.clear()
            t = time.perf_counter()
            r = run_mode(engine, w, inputs, mode, sampling)
            acc["wall"].append(time.perf_counter() - t)
            for k, v in stats.items(): acc[k].append(v[1])
            acc["steps"].append(r["scheduler_steps"])
        print(f"{name} {mode}: " + ", ".join(f"{k} {1000*statistics.median(v):.1f}" if k != "steps" else f"steps {statistics.median(v)}" for k, v in acc.items()), flush=True)
