"""Tables for the history from measure.sh's JSON: per workload, base and new, the median over all
runs' rounds of the engine thread's CPU s a round, the program threads' CPU s a round, and the
host-only time a program ((wall - stand-in model) / 64); then step_timeline's graph host-only ms
a program, median of its runs. Run from this folder."""

import glob
import json
import statistics

N = 64


def rounds(tree: str) -> dict:
    out: dict = {}
    for path in sorted(glob.glob(f"cpu_{tree}_*.json")):
        for name, w in json.load(open(path))["workloads"].items():
            out.setdefault(name, []).extend(w["rounds"])
    return out


def med(rs: list, key) -> float:
    return statistics.median(key(r) for r in rs)


def main() -> None:
    base, new = rounds("base"), rounds("new")
    runs = len(glob.glob("cpu_base_*.json")), len(glob.glob("cpu_new_*.json"))
    print(f"thread_cpu.py, graph rounds, medians over all rounds of {runs[0]} base / {runs[1]} new runs (5 rounds a run)\n")
    print("| workload | engine thread CPU s a round, base -> new | program threads CPU s | host-only ms a program | steps |")
    print("| --- | --- | --- | --- | --- |")
    ratios = []
    for name in base:
        b, n = base[name], new.get(name, [])
        if not n:
            continue
        e = (med(b, lambda r: r["engine_cpu_s"]), med(n, lambda r: r["engine_cpu_s"]))
        p = (med(b, lambda r: r["program_cpu_s"]), med(n, lambda r: r["program_cpu_s"]))
        h = [med(x, lambda r: 1000 * (r["wall_s"] - r["model_s"]) / N) for x in (b, n)]
        s = (med(b, lambda r: r["steps"]), med(n, lambda r: r["steps"]))
        ratios.append((e[1] / e[0], h[1] / h[0]))
        print(f"| {name} | {e[0]:.3f} -> {e[1]:.3f} ({e[1] / e[0]:.2f}x) | {p[0]:.3f} -> {p[1]:.3f} | "
              f"{h[0]:.1f} -> {h[1]:.1f} ({h[1] / h[0]:.2f}x) | {s[0]:.0f} / {s[1]:.0f} |")
    g = [statistics.geometric_mean(x) for x in zip(*ratios)]
    print(f"\ngeometric mean new / base: engine CPU {g[0]:.2f}x, host-only {g[1]:.2f}x")
    print("\nstep_timeline.py --stand-in-model, graph mode, host-only ms a program (wall - model) / 64, per run:\n")
    print("| workload | base runs | new runs | median base -> new |")
    print("| --- | --- | --- | --- |")
    tl = {t: [json.load(open(p))["results"] for p in sorted(glob.glob(f"timeline_{t}_*.json"))] for t in ("base", "new")}
    for name in (tl["base"][0] if tl["base"] else {}):
        vals = {t: [1000 * (r[name]["graph"]["wall_s"] - r[name]["graph"]["model_s"]) / N for r in tl[t] if name in r]
                for t in tl}  # fmt: skip
        if vals["base"] and vals["new"]:
            mb, mn = statistics.median(vals["base"]), statistics.median(vals["new"])
            print(f"| {name} | {', '.join(f'{v:.1f}' for v in vals['base'])} | {', '.join(f'{v:.1f}' for v in vals['new'])} | "
                  f"{mb:.1f} -> {mn:.1f} ({mn / mb:.2f}x) |")


if __name__ == "__main__":
    main()
