# Session 33, call F: the FP8 GEMM tests after the review (fp8_gemm's bits per accumulation setting).
source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
mkdir -p $OUT; cp .gpulead/lead_s33f.sh $OUT/
nvidia-smi --query-gpu=name --format=csv
export RADIXFLOW_TOKENIZER=$PWD/.gpulead/.gpu_assets/tokenizer
timeout 60 python3 -m pytest -q tests/test_fp8.py -k "gemm" > $OUT/pytest.txt 2>&1; echo rc $?; tail -3 $OUT/pytest.txt
