python3 -m pip install -q --no-deps --no-index --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
cd .gpulead/tree && export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/../.gpu_assets/tokenizer
NCU=/usr/local/cuda/bin/ncu
date
timeout 260 python3 benchmarks/fp8_attn_bench.py --out $OUT/sweep --cases 1000x1500,768xU,512x1536,256x1536 --variants '_r|w4s|^n64w2s5_e2$|^n32w1s5_e2$|^n64w1s5_e2$' > $OUT/sweep.log 2>&1
echo "sweep rc $?"; grep -v "^\s*$" $OUT/sweep.log | tail -45 | cut -c1-250
date
P="python3 benchmarks/ncu_decode_attn.py --pool fp8"
timeout 120 $NCU --clock-control none -k regex:_decode_stage1 --launch-skip 1 --launch-count 1 --section SourceCounters --section WarpStateStats -o $OUT/fp8_src $P > $OUT/ncu_src.log 2>&1
echo "ncu src rc $?"
$NCU -i $OUT/fp8_src.ncu-rep --page source --print-source sass --csv > $OUT/fp8_sass.csv 2>&1; echo "csv rc $? $(wc -l < $OUT/fp8_sass.csv)"
for c in '{"fp8": {"block_n": 64, "num_warps": 2, "num_stages": 3, "fp8_exp2": true, "maxnreg": 168}}' '{"fp8": {"block_n": 32, "num_warps": 1, "num_stages": 5, "fp8_exp2": true}}' '{"fp8": {"block_n": 64, "num_warps": 4, "num_stages": 3, "fp8_exp2": true}}'; do
  echo "== $c"
  timeout 90 $NCU --clock-control none -k regex:_decode_stage1 --launch-skip 1 --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats $P --config "$c" > $OUT/ncu_var.txt 2>&1
  grep -E "^pool|Duration|DRAM Throughput|Achieved Occupancy|Registers Per Thread  |Dynamic Shared Memory Per Block|Block Limit Reg|Block Limit Shared|Eligible Warps Per|Warp Cycles Per Issued|Issued Warp Per" $OUT/ncu_var.txt | sort -u | head -14
done
date
