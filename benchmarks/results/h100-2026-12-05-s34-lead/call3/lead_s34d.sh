# Session 34, call D: (1) batch 1, bf16 and FP8, at the default --mem-fraction-static (call A's 0.95 left no room
# for the bandwidth probe); (2) with the admission fix (a chunked request finishing its prefill counts against
# max_running_requests): the 1,000 in / 1,000 out workload (FP8 weights + FP8 KV, 0.95) capped at 512 running
# requests, then uncapped (the default 1,024), one engine each.
source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
export PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .gpulead/lead_s34d.sh $OUT/; git diff > $OUT/tree.diff
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu.txt; cat $OUT/gpu.txt
T=$PWD/.gpulead/.gpu_assets/tokenizer
export RADIXFLOW_TOKENIZER=$T
echo "== $(date +%T) batch 1"
timeout 220 python3 benchmarks/gpu_bench.py --out $OUT/b1 --tokenizer $T --sections bs1,bs1@fp8 --deadline-s 200 > $OUT/b1.log 2>&1; echo rc $?
python3 - $OUT/b1/results.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for k, v in d.items():
    if isinstance(v, dict):
        print(" ", k, {kk: (round(x, 3) if isinstance(x, float) else x) for kk, x in v.items() if kk in ("tok_s", "replay_step_ms", "gemv_only_ms", "copy_bw_TBps_now", "read_bw_TBps_now", "bandwidth_error", "roofline_bw_TBps", "step_read_GB", "pct_of_roofline", "replay_pct_of_roofline", "gemv_only_pct_of_roofline")})
PY
echo "== $(date +%T) 1k/1k capped at 512, then uncapped"
timeout 330 python3 benchmarks/gpu_bench.py --out $OUT/k --tokenizer $T --mem-fraction-static 0.95 --sections offline_1k@fp8kv8r512,offline_1k@fp8kv8 --deadline-s 200 > $OUT/k.log 2>&1; echo rc $?
python3 - $OUT/k/results.json <<'PY'
import json, sys, collections
d = json.load(open(sys.argv[1]))
for k, v in d.items():
    if isinstance(v, dict):
        print(" ", k, {kk: (round(x, 3) if isinstance(x, float) else x) for kk, x in v.items() if kk in ("s", "out_tok_s", "extend_gpu_s", "decode_gpu_s", "decode_steps", "mode_runs")})
        by = collections.defaultdict(list)
        for bs, kv, ms in v.get("decode_steps_bs_kv_ms", []): by[bs].append(ms)
        print("    steps by batch:", {b: (len(m), round(sum(m) / len(m), 2)) for b, m in sorted(by.items())[-6:]})
PY
echo "== $(date +%T) end"
