"""Medians over all rounds of each tree (measure.sh's cpu_<tree>_<i>.json): engine-thread and program-thread CPU s a round."""
import glob, json, statistics, sys
d = sys.argv[1] if len(sys.argv) > 1 else "/tmp/ghost/m"
rows = {}
for tree in ("base", "new"):
    for f in sorted(glob.glob(f"{d}/cpu_{tree}_*.json")):
        for wl, r in json.load(open(f))["workloads"].items():
            for x in r["rounds"]:
                rows.setdefault(wl, {}).setdefault(tree, []).append(x)
print("| workload | engine thread CPU s a round, base -> new | program threads CPU s | both | steps | rounds |")
print("| --- | --- | --- | --- | --- | --- |")
for wl, t in rows.items():
    if "new" not in t: continue
    m = lambda tree, k: statistics.median(x[k] for x in t[tree])
    both = lambda tree: statistics.median(x["engine_cpu_s"] + x["program_cpu_s"] for x in t[tree])
    e0, e1, p0, p1 = m("base", "engine_cpu_s"), m("new", "engine_cpu_s"), m("base", "program_cpu_s"), m("new", "program_cpu_s")
    print(f"| {wl} | {e0:.3f} -> {e1:.3f} ({e1/e0:.2f}x) | {p0:.3f} -> {p1:.3f} ({p1/p0:.2f}x) | {both('base'):.3f} -> {both('new'):.3f} ({both('new')/both('base'):.2f}x) | {m('base','steps'):.0f} / {m('new','steps'):.0f} | {len(t['base'])} / {len(t['new'])} |")
