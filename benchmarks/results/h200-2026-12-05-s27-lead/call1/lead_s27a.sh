# Session 27, call 1: the GEMV dot configs on the GPU: correct (tests), timed per shape (fp8_kernels), then
# batch-1 decode with the chooser's lists as they are (head) against the lists extended by the dot configs (ext).
source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
export PYTHONUNBUFFERED=1
T=$PWD/.gpulead/.gpu_assets/tokenizer
mkdir -p $OUT; cp .gpulead/lead_s27a.sh $OUT/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu.txt
echo "== $(date +%T) gemv tests (dot configs included)"
timeout 100 python3 -m pytest -q -x tests/test_kernels.py tests/test_fp8.py tests/test_gemv_epilogue.py -k "gemv or every or dot" > $OUT/pytest.txt 2>&1; echo rc $?; tail -2 $OUT/pytest.txt
rm -rf /tmp/ext; mkdir -p /tmp/ext; cp -r radixflow benchmarks scripts pyproject.toml /tmp/ext/
cat >> /tmp/ext/radixflow/kernels/gemv.py <<'PY'
from radixflow.kernels.gemv_dot import GEMV_DOT_CONFIGS as _DOT, GEMV_DOT_CONFIGS_FP8 as _DOT8  # noqa: E402
GEMV_CONFIGS = GEMV_CONFIGS + _DOT
GEMV_CONFIGS_FP8 = GEMV_CONFIGS_FP8 + _DOT8
PY
for arm in head ext; do
  echo "== $(date +%T) bs1,bs1@fp8 $arm"
  d=$PWD; [ $arm = ext ] && d=/tmp/ext
  (cd $d && PYTHONPATH=$d:/tmp/site timeout 140 python3 benchmarks/gpu_bench.py --out $OUT/bs1_$arm --tokenizer $T --graph-max-bs 8 --sections bs1,bs1@fp8 --deadline-s 90 > $OUT/bs1_$arm.log 2>&1; echo rc $?)
  grep -o '"tok_s": [0-9.]*\|"replay_pct_of_roofline": [0-9.]*\|"gemv_only_pct_of_roofline": [0-9.]*' $OUT/bs1_$arm/results.json 2>/dev/null | tr '\n' ' '; echo
done
echo "== $(date +%T) gemv timings (fp8_kernels: gemv only)"
timeout 150 python3 benchmarks/gpu_bench.py --out $OUT/gemv --tokenizer $T --sections fp8_kernels --fp8-kernels gemv > $OUT/gemv.log 2>&1; echo rc $?
grep "gemv " $OUT/gemv.log | cut -c1-400
echo "== $(date +%T) end"
