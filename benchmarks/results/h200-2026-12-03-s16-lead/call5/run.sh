python3 -m pip install -q --no-deps --no-index --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
cd .gpulead/tree && export PYTHONPATH=$PWD:/tmp/wh
P="python3 benchmarks/ncu_decode_attn.py --pool fp8"
for c in '{}' '{"fp8_qk8": true}' '{"fp8": {"block_n": 64, "num_warps": 2, "num_stages": 5, "fp8_exp2": true}}' '{"fp8_qk8": true, "fp8": {"block_n": 64, "num_warps": 2, "num_stages": 5, "fp8_exp2": true}}' '{"fp8_qk8": true, "fp8": {"block_n": 64, "num_warps": 4, "num_stages": 3, "fp8_exp2": true}}'; do
  echo "== $c"; timeout 60 $P --config "$c" 2>&1 | grep -E "^pool|Error|error" | tail -2 | cut -c1-300
done
for c in '{}' '{"fp8_qk8": true}'; do echo "== 256x1536 $c"; timeout 60 $P --batch 256 --len 1536 --config "$c" 2>&1 | grep -E "^pool|Error" | tail -1 | cut -c1-300; done
