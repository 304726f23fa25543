python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/wh
export RADIXFLOW_TOKENIZER=$PWD/.gpulead/.gpu_assets/tokenizer
T=$RADIXFLOW_TOKENIZER
mkdir -p $OUT
cp .gpulead/lead_s22b.sh $OUT/
echo "== $(date +%T) attn"
timeout 300 python3 benchmarks/bf16_attn_bench.py --out $OUT/attn --jobs 14 --cases 16x516,64x516,128x516,200x516,64xU,128xU,256xU --min-batch 16 > $OUT/attn.log 2>&1; echo rc $?
grep -A12 "^16x516\|^64x516\|^128x516\|^200x516\|^64xU\|^128xU\|^256xU\|^best" $OUT/attn.log | cut -c1-130
echo "== $(date +%T) gemm"
timeout 200 python3 benchmarks/gpu_bench.py --tokenizer $T --out $OUT/g --sections decode_gemm > $OUT/g.log 2>&1; echo rc $?
python3 - <<'PY'
import json,os
d=json.load(open(os.environ["OUT"]+"/g/results.json"))["decode_gemm"]
for sh,rows in d.items():
    for m,r in rows.items():
        print(sh,m,"bound",r["bound_us"],"cublas",r["cublas"],"lt",r["cublaslt"],"bi",r["triton_bi"],"best",r.get("best_skinny"),r.get(r.get("best_skinny")))
PY
echo "== $(date +%T) end"
