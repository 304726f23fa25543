import json, statistics, os
commits = [("9bd6315", "session 11's start"), ("84836b4", "before C, E, F"), ("b6933ba", "+ E progthreads"),
           ("d7f74c9", "+ C enghost"), ("1a53bea", "+ F split"), ("6a7cfb1", "+ mendE"), ("994cf94", "now (main)")]
print("| commit | " + " | ".join(f"{w} process CPU s g / e | {w} engine thread g / e" for w in ("mmlu", "hellaswag", "json_decode")) + " |")
print("| --- " * 7 + "|")
for c, what in commits:
    f = f"/tmp/gve/b_{c}.json"
    if not os.path.exists(f):
        continue
    d = json.load(open(f))
    cells = []
    for w in ("mmlu", "hellaswag", "json_decode"):
        rows = d[w]
        med = lambda m, k: statistics.median(r[k] for r in rows if r["mode"] == m)
        cells.append(f"{med('graph','proc'):.3f} / {med('eager','proc'):.3f} ({med('graph','proc')/med('eager','proc'):.2f}x)")
        cells.append(f"{med('graph','engine'):.3f} / {med('eager','engine'):.3f} ({med('graph','engine')/med('eager','engine'):.2f}x)")
    print(f"| {c} ({what}) | " + " | ".join(cells) + " |")
