"""Engine-thread wall time inside ProgramExecutor.submit per graph-mode round (no profiler): tiny config,
stand-in model, Llama-3 tokenizer, 128 programs a round, 64 in flight; after two warm-up rounds, 3 rounds."""
import os, random, sys, time, statistics
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks", "programs"))
import radixflow as rf
from radixflow.runtime.programs.program_executor import ProgramExecutor
from run import run_mode
from step_timeline import stand_in_forward
from workloads import BY_NAME
spent = [0.0]
real = ProgramExecutor.submit
def timed(self, *a, **k):
    t = time.perf_counter()
    try:
        return real(self, *a, **k)
    finally:
        spent[0] += time.perf_counter() - t
ProgramExecutor.submit = timed
with rf.Engine("benchmarks/configs/smollm2-tiny.json", load_format="dummy", max_total_tokens=800000,
               tokenizer_path="/work/main/.gpulead/.gpu_assets/tokenizer") as engine:
    stand_in_forward(engine)
    for name in sys.argv[1].split(","):
        w = BY_NAME[name]; inputs = w.inputs(random.Random(0), 128, 1.0); sampling = {"max_new_tokens": 8, "temperature": 0}
        for _ in range(2): run_mode(engine, w, inputs, "graph", sampling, in_flight=64)
        rows = []
        for _ in range(3):
            spent[0] = 0.0
            r = run_mode(engine, w, inputs, "graph", sampling, in_flight=64)
            rows.append((1000 * spent[0], r["round_s"], r["forward_steps"], r["cpu_per_program"]))
        print(name, "submit ms a round:", " ".join(f"{a:.1f}" for a, *_ in rows), "| round s:", " ".join(f"{x[1]:.2f}" for x in rows), "| passes:", " ".join(str(x[2]) for x in rows), "| CPU ms a program:", " ".join(f"{1000*x[3]:.2f}" for x in rows), flush=True)
