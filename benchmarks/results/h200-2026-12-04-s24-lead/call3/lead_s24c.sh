# A/B in one call: the session's start tree (ff2c801, carried in .gpulead/base) and the working tree, one suite run each
source scripts/gpu_site.sh .gpulead/.whl /tmp/site || exit 3
export PYTHONUNBUFFERED=1
export RADIXFLOW_TOKENIZER=$PWD/.gpulead/.gpu_assets/tokenizer
T=$RADIXFLOW_TOKENIZER
M="--config benchmarks/configs/llama3-8b.json --load-format dummy --tokenizer $T --max-total-tokens 400000"
S="--n 64 --size 1.0 --repeats 2 --baseline-repeats 1 --min-round-s 0.5 --deadline-s 170"
mkdir -p $OUT
cp .gpulead/lead_s24c.sh $OUT/
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu.txt
echo "== $(date +%T) base ff2c801"
(cd .gpulead/base && PYTHONPATH=$PWD:/tmp/site timeout 245 python3 benchmarks/programs/run.py --device cuda $M $S --json $OUT/base.json > $OUT/base.log 2>&1; echo rc $?)
grep "Geometric" $OUT/base.log | tail -1 | cut -c1-200
echo "== $(date +%T) head"
PYTHONPATH=$PWD:/tmp/site timeout 245 python3 benchmarks/programs/run.py --device cuda $M $S --json $OUT/head.json > $OUT/head.log 2>&1; echo rc $?
grep "Geometric" $OUT/head.log | tail -1 | cut -c1-200
echo "== $(date +%T) end"
