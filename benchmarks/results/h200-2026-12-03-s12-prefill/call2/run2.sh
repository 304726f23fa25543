#!/bin/bash
# Task C (issue 28, session 12) call 2: old tree (main 994cf94) against new (s12-prefill) in one call:
# prefill 8 x 2,048 and offline seed 2024 each (old first); the new tree's cuDNN A/B and per-shape attention;
# the GPU tests of what changed.
S=$(date +%s)
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/wh .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONUNBUFFERED=1 RADIXFLOW_TOKENIZER=$PWD/.gpu_assets/tokenizer
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
B="--tokenizer $PWD/.gpu_assets/tokenizer --offline-seeds 2024 --offline-warmup 64"
echo "== tests $(date +%T)"
(cd new && PYTHONPATH=$PWD:/tmp/wh timeout 50 python3 -m pytest -q -p no:cacheprovider tests/test_flash_prefill.py tests/test_decode_entries.py -k "gpu" > $OUT/tests.txt 2>&1; echo rc=$?; tail -4 $OUT/tests.txt)
echo "== old $(date +%T) elapsed $(( $(date +%s) - S ))"
(cd old && PYTHONPATH=$PWD:/tmp/wh timeout 115 python3 benchmarks/gpu_bench.py --out $OUT/old $B --sections matmul_rate,prefill,offline > /dev/null 2>&1; echo rc=$?)
echo "== new $(date +%T) elapsed $(( $(date +%s) - S ))"
(cd new && PYTHONPATH=$PWD:/tmp/wh timeout 135 python3 benchmarks/gpu_bench.py --out $OUT/new $B --prefill-cudnn-ab --sections matmul_rate,prefill,offline,prefill_attention > /dev/null 2>&1; echo rc=$?)
echo "== end $(date +%T) elapsed $(( $(date +%s) - S ))"
python3 - <<'PY'
import json, os
o = os.environ["OUT"]
for arm in ("old", "new"):
    try:
        r = json.load(open(f"{o}/{arm}/results.json"))
    except Exception as e:
        print(arm, "no results", e); continue
    p, off = r.get("prefill", {}), r.get("offline", {}).get("seed2024", {})
    print(f"{arm}: mm {r.get('matmul_rate', {}).get('bf16_matmul_TFLOPs', 0):.1f} | prefill tok/s {p.get('tok_s', 0):.0f} "
          f"({p.get('pct_of_matmul_rate', 0):.1f}%) | offline out tok/s {off.get('out_tok_s', 0):.0f} extend "
          f"{off.get('extend_gpu_s', 0):.3f} decode {off.get('decode_gpu_s', 0):.3f} | err {[k for k, v in r.items() if isinstance(v, dict) and 'error' in v]}")
    for k in ("cudnn_enabled", "cudnn_shapes", "tok_s_cudnn_off", "tok_s_cudnn_on", "tok_s_cudnn_off_again",
              "pct_of_matmul_rate_cudnn_off", "pct_of_matmul_rate_cudnn_on", "pct_of_matmul_rate_cudnn_off_again"):
        if k in p:
            print(f"   {k}: {p[k]}")
    for k, v in r.get("prefill_attention", {}).get("dense_shapes", {}).items():
        print(f"   {k}: {v}")
PY
