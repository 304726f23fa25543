set -x
python3 -m pip install -q --no-deps --target /tmp/wh .gpuA/.whl/*.whl 2>&1 | tail -2
cd .gpuA/tree && export PYTHONPATH=$PWD:/tmp/wh PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv
timeout 70 python3 -m pytest -q -n 8 -m gpu tests/test_gemv_epilogue.py 2>&1 | tail -25 | tee $OUT/pytest.log
timeout 200 python3 benchmarks/gpu_bench.py --out $OUT/bench --tokenizer ../.gpu_assets/tokenizer --graph-max-bs 8 \
  --sections bs1,correctness,bs1@fp8,bs1@nofold --corr-configs smollm2-135m --corr-dtypes float32,bfloat16 \
  --deadline-s 150 2>&1 | grep -v Warning | tail -40
ls -la $OUT $OUT/bench
