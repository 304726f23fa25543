# Session 32, call 5 (H100): the FP8 GEMM alone across decode batches (fp8_kernels parts gemm and gemm_m: row-wise
# _scaled_mm as the engine calls it, fast accumulation, operands swapped, bf16; one scale per tensor at 256/544/1,024).
source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
export PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .gpulead/lead_s32d.sh $OUT/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu.txt; cat $OUT/gpu.txt
echo "== $(date +%T) fp8_kernels gemm,gemm_m"
timeout 400 python3 benchmarks/gpu_bench.py --out $OUT/k --tokenizer .gpulead/.gpu_assets/tokenizer --sections fp8_kernels --fp8-kernels gemm,gemm_m --deadline-s 360 > $OUT/k.log 2>&1; echo rc $?
python3 - $OUT/k/results.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["fp8_kernels"]
for part in ("gemm", "gemm_m"):
    for shape, rows in d.get(part, {}).items():
        for m, row in rows.items():
            print(part, shape, m, {k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items() if not isinstance(v, dict)})
PY
echo "== $(date +%T) end"
