"""Host-only ms per program, per workload and mode: median over the runs of each tree, and new / base."""
import glob, json, statistics, sys
OUT = sys.argv[1]
WL = ["react", "llm_judge", "tree_of_thought", "hellaswag", "mmlu"]

def default_host(path):
    d = json.load(open(path))["results"]
    out = {}
    for w in WL:
        if w not in d: continue
        r = d[w]
        n = r["programs_per_round"]
        for mode in ("graph", "eager", "eager-noradix"):
            runs = r[mode]["runs"]
            out[(w, mode)] = [1000 * (x["round_s"] - x["model_s"]) / n for x in runs]
            out[(w, mode, "passes")] = [x["forward_steps"] for x in runs]
            out[(w, mode, "round")] = [1000 * x["round_s"] / n for x in runs]
    return out

def standin_host(path, n=64):
    d = json.load(open(path))["results"]
    out = {}
    for w in WL:
        if w not in d: continue
        for mode in ("graph", "eager"):
            x = d[w][mode]
            out[(w, mode)] = [1000 * (x["wall_s"] - x["model_s"]) / n]
            out[(w, mode, "passes")] = [x["steps"]]
    return out

for kind, fn in (("default", default_host), ("standin", standin_host)):
    vals = {}
    for tree in ("base", "new"):
        acc = {}
        for p in sorted(glob.glob(f"{OUT}/{kind}_{tree}_*.json")):
            for k, v in fn(p).items():
                acc.setdefault(k, []).extend(v)
        vals[tree] = acc
    if not vals["base"]:
        continue
    modes = ("graph", "eager", "eager-noradix") if kind == "default" else ("graph", "eager")
    print(f"\n{kind}: host-only ms per program, median (runs) base -> new, new/base; passes base / new (medians)")
    print("| workload | " + " | ".join(modes) + " |")
    print("| --- |" + " --- |" * len(modes))
    for w in WL:
        cells = []
        for m in modes:
            b, n = vals["base"].get((w, m)), vals["new"].get((w, m))
            if not b or not n:
                cells.append("-"); continue
            mb, mn = statistics.median(b), statistics.median(n)
            pb, pn = statistics.median(vals["base"][(w, m, "passes")]), statistics.median(vals["new"][(w, m, "passes")])
            cells.append(f"{mb:.1f} -> {mn:.1f} ({mn / mb:.2f}x; {len(b)}/{len(n)} runs; passes {pb:g} / {pn:g})")
        print(f"| {w} | " + " | ".join(cells) + " |")
