"""Session 10's H200 call (task B): graph mode's rounds in the engine with extend graphs (all three
modes) against the engine without them (graph rounds only), per workload: round, GPU busy, host-only
(round - GPU busy) and the CPU time of the round's programs. Host-only = round - GPU busy by
definition, so its change is the round's change minus GPU busy's."""
import json, math, statistics as st, sys

path = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/h200-2026-12-02-s10-programs/s10_programs.json"
by = json.load(open(path))["by_extend_graph_tokens"]
on, off = by["default"], by["0"]
print("| workload | round s on / off | GPU busy s on / off | host-only s on / off | change: round / GPU busy / host-only | change in CPU s a round |")
print("| --- | --- | --- | --- | --- | --- |")
dr, dc = [], []
for name in off:
    if name == "timelines":
        continue
    a, b, k = on[name]["graph"]["runs"], off[name]["graph"]["runs"], on[name]["programs_per_round"]
    m = lambda rs, f: st.mean(f(r) for r in rs)
    R, G = (lambda r: r["round_s"]), (lambda r: r["gpu_s"])
    H, C = (lambda r: r["round_s"] - r["gpu_s"]), (lambda r: r["cpu_per_program"] * k)
    d = [m(a, f) - m(b, f) for f in (R, G, H, C)]
    dr.append(d[0]); dc.append(d[3])
    print(f"| {name} | {m(a, R):.3f} / {m(b, R):.3f} | {m(a, G):.3f} / {m(b, G):.3f} | {m(a, H):.3f} / {m(b, H):.3f} | "
          f"{d[0]:+.3f} / {d[1]:+.3f} / {d[2]:+.3f} | {d[3]:+.3f} |")
mr, mc = st.mean(dr), st.mean(dc)
cov = sum((x - mr) * (y - mc) for x, y in zip(dr, dc))
r = cov / math.sqrt(sum((x - mr) ** 2 for x in dr) * sum((y - mc) ** 2 for y in dc))
print(f"\ncorrelation of the round's change with the CPU time's change over the {len(dr)} workloads: {r:.2f}")
