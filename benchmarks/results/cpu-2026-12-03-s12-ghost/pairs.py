"""Per pair (cpu_base_i, cpu_new_i): each workload's new/base ratio of median engine+program CPU; and each workload's
round ranges (min-max over all rounds) per tree."""
import glob, json, statistics, math
d = "/tmp/ghost/m"
for i in range(1, 7):
    b, n = (json.load(open(f"{d}/cpu_{t}_{i}.json"))["workloads"] for t in ("base", "new"))
    r = {w: statistics.median(x["engine_cpu_s"] + x["program_cpu_s"] for x in n[w]["rounds"]) /
            statistics.median(x["engine_cpu_s"] + x["program_cpu_s"] for x in b[w]["rounds"]) for w in b}
    print(f"pair {i}: geomean {math.exp(statistics.mean(math.log(v) for v in r.values())):.3f}  " + " ".join(f"{w[:8]} {v:.2f}" for w, v in r.items()))
for k in ("program_cpu_s", "engine_cpu_s"):
    print(k)
    for w in json.load(open(f"{d}/cpu_base_1.json"))["workloads"]:
        rng = {}
        for t in ("base", "new"):
            xs = [x[k] for f in glob.glob(f"{d}/cpu_{t}_*.json") for x in json.load(open(f))["workloads"][w]["rounds"]]
            rng[t] = (min(xs), max(xs))
        print(f"  {w}: base {rng['base'][0]:.3f}-{rng['base'][1]:.3f}  new {rng['new'][0]:.3f}-{rng['new'][1]:.3f}")
