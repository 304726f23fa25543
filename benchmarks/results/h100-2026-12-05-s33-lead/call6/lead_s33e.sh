# Session 33, call E: fp8_kernels' gemm_m sweep with the engine's product (padded, fast accumulation) beside cuBLAS's
# per-tensor product with fast accumulation, alone and with the row / column scales applied after it.
source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
export PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .gpulead/lead_s33e.sh $OUT/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu.txt; cat $OUT/gpu.txt
T=$PWD/.gpulead/.gpu_assets/tokenizer
timeout 150 python3 benchmarks/gpu_bench.py --out $OUT/k --tokenizer $T --sections fp8_kernels --fp8-kernels gemm_m --deadline-s 140 > $OUT/k.log 2>&1; echo rc $?
python3 - $OUT/k/results.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["fp8_kernels"]
print("shape m: padded_fast / tensorwise_fast / tensorwise_fast_rescaled us, rescaled max rel diff")
for shape, rows in d.get("gemm_m", {}).items():
    print(shape, " ".join(f"{m[1:]}:{r.get('scaled_mm_padded_fast')}/{r.get('tensorwise_fast')}/{r.get('tensorwise_fast_rescaled')}/{r.get('rescaled_max_rel_diff', 0):.4f}" for m, r in rows.items()))
PY
