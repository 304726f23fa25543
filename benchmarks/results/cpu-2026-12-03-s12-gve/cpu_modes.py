"""Graph vs eager rounds with the stand-in model: per round the CPU s of the engine thread, the
program threads, the rest, and the whole process (thread CPU clocks). Session 12 task A's CPU bisect:
run in a `git archive` of each commit (bisect.sh), TOK = the GPU calls' Llama-3 tokenizer;
table.py prints the medians."""
import argparse, json, os, random, sys, threading, time
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks", "programs"))
import radixflow as rf
from run import run_mode
from step_timeline import stand_in_forward
from workloads import BY_NAME

def groups():
    out = {"engine": 0.0, "program": 0.0, "other": 0.0}
    for t in threading.enumerate():
        g = "engine" if t.name.startswith("rf-engine") else "program" if t.name.startswith("rf-program") else "other"
        if t.ident is not None:
            try: out[g] += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except OSError: pass
    return out

def rnd(engine, w, inputs, mode, sampling, n):
    b, c = groups(), time.process_time()
    r = run_mode(engine, w, inputs, mode, sampling, in_flight=n)
    a = groups()
    return {"mode": mode, "proc": time.process_time() - c, **{k: a[k] - b[k] for k in a}, "steps": r["scheduler_steps"],
            "round_s": r["round_s"], "p50": r["p50"]}

ap = argparse.ArgumentParser()
ap.add_argument("--workloads", default="mmlu,hellaswag,json_decode")
ap.add_argument("--n", type=int, default=64); ap.add_argument("--waves", type=int, default=1)
ap.add_argument("--rounds", type=int, default=3); ap.add_argument("--json")
ap.add_argument("--order", default="ge")
args = ap.parse_args()
sampling = {"max_new_tokens": 8, "temperature": 0}
out = {}
with rf.Engine("benchmarks/configs/smollm2-tiny.json", load_format="dummy", max_total_tokens=800000, **({"tokenizer_path": os.environ["TOK"]} if os.environ.get("TOK") else {})) as engine:
    stand_in_forward(engine)
    for name in args.workloads.split(","):
        w = BY_NAME[name]
        inputs = w.inputs(random.Random(0), args.n * args.waves, 1.0)
        for m in ("graph", "eager", "graph", "eager"):
            rnd(engine, w, inputs, m, sampling, args.n)
        engine.freeze_gc()
        rows = []
        for k in range(args.rounds):
            for m in (("graph", "eager") if k % 2 == 0 else ("eager", "graph")):
                rows.append(rnd(engine, w, inputs, m, sampling, args.n))
        out[name] = rows
        med = lambda m, f: sorted(r[f] for r in rows if r["mode"] == m)[len([r for r in rows if r["mode"] == m]) // 2]
        print(name, " ".join(f"{f} g {med('graph', f):.3f} e {med('eager', f):.3f}" for f in ("round_s", "proc", "engine", "program", "other")),
              f"steps g {med('graph','steps')} e {med('eager','steps')}", flush=True)
if args.json:
    json.dump(out, open(args.json, "w"), indent=1)
