python3 -m pip install -q --no-deps --no-index --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
cd .gpulead/tree && export PYTHONPATH=$PWD:/tmp/wh RADIXFLOW_TOKENIZER=$PWD/../.gpu_assets/tokenizer
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"; $NCU --version | tail -1
for p in fp8 bf16; do python3 benchmarks/ncu_decode_attn.py --pool $p; done
python3 benchmarks/ncu_decode_attn.py --pool fp8 --config '{"fp8": {"block_n": 32, "num_warps": 1, "num_stages": 5, "fp8_exp2": true}}'
for p in fp8 bf16; do
  timeout 200 $NCU --clock-control none --kernel-name regex:_decode_stage1 --launch-skip 1 --launch-count 1 --set full \
     --import-source no --print-details all python3 benchmarks/ncu_decode_attn.py --pool $p > $OUT/ncu_$p.txt 2>&1
  echo "== $p rc $?"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Shared Memory Configuration|Dynamic Shared|Issued Ipc|No Eligible|Warp Cycles Per Issued|Block Limit|L2 Hit|L1/TEX Hit|Executed Instructions  |Waves Per SM|Stall|Eligible Warps" $OUT/ncu_$p.txt | head -60
done
