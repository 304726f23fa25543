# Session 32, call 1: decode attention's splits merged inline (issue 28): GPU tests, then batch-1 decode bf16 and FP8,
# each engine A/B-ing its graph (inline merge, as built) against one with stage 2's kernel, interleaved twice.
source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
export PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .gpulead/lead_s32a.sh $OUT/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu.txt; cat $OUT/gpu.txt
echo "== $(date +%T) decode attention tests"
timeout 150 python3 -m pytest -q tests/test_kernels.py tests/test_decode_entries.py tests/test_fp8_attention.py -k "decode and not cuda_graph_decode_equals_eager" > $OUT/pytest.txt 2>&1; echo rc $?; tail -3 $OUT/pytest.txt
echo "== $(date +%T) bs1,bs1@fp8"
timeout 330 python3 benchmarks/gpu_bench.py --out $OUT/bs1 --tokenizer .gpulead/.gpu_assets/tokenizer --graph-max-bs 8 --sections bs1,bs1@fp8 --deadline-s 280 > $OUT/bs1.log 2>&1; echo rc $?
python3 - $OUT/bs1/results.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
keys = ("tok_s", "replay_step_ms", "replay_pct_of_roofline", "pct_of_roofline", "gemv_only_pct_of_roofline",
        "roofline_bw_TBps", "merge_tok_s_ratio", "merge_replay_ms_on", "merge_replay_ms_off", "epilogue_tok_s_ratio")
for sec, v in d.items():
    if isinstance(v, dict):
        print(sec, {k: round(v[k], 4) for k in keys if isinstance(v.get(k), float)})
        print("  ", {k: round(x, 2) for k, x in v.items() if k.startswith(("merge_on", "graph_tok_s_merge", "replay_step_ms_merge", "logits_maxdiff_merge"))})
PY
echo "== $(date +%T) end"
