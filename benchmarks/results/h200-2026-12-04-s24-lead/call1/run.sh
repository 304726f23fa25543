# session 24, call 1 (one H200, torch 2.11, Triton 3.6)
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
python3 -c "import triton, torch; print(triton.__version__, torch.__version__)"
timeout 540 python3 benchmarks/fp8_wgmma_probe.py --json $OUT/probe.json 2>&1 | grep -v -i warn
