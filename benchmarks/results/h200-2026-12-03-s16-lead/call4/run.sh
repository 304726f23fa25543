python3 -m pip install -q --no-deps --no-index --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
cd .gpulead/tree && export PYTHONPATH=$PWD:/tmp/wh
NCU=/usr/local/cuda/bin/ncu
P="python3 benchmarks/ncu_decode_attn.py --pool fp8"
$P
timeout 150 $NCU --clock-control none -k regex:_decode_stage1 --launch-skip 1 --launch-count 1 --set full -o $OUT/large $P > $OUT/ncu_large.log 2>&1
echo "ncu rc $?"
$NCU -i $OUT/large.ncu-rep --page details > $OUT/ncu_large.txt 2>&1
$NCU -i $OUT/large.ncu-rep --page source --print-source sass --csv > $OUT/large_sass.csv 2>&1
rm -f $OUT/large.ncu-rep
grep -E "Duration|DRAM Throughput|Achieved Occupancy|Registers Per Thread  |Dynamic Shared Memory Per Block|Block Limit Reg|Block Limit Shared|Eligible Warps Per|Warp Cycles Per Issued|Issued Warp Per|Stall (Short|Long|Wait|MIO|Math|Barrier)|L1 Wavefronts Shared Excessive|Executed Instructions  " $OUT/ncu_large.txt | sort -u | head -30
