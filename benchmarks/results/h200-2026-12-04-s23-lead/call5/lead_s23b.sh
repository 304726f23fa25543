rm -rf /tmp/wh; python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/wh python3 -c 'import llguidance; from importlib.metadata import version as v; print("llguidance", v("llguidance"))' || exit 3
export PYTHONUNBUFFERED=1
T=$PWD/.gpulead/.gpu_assets/tokenizer
mkdir -p $OUT; cp .gpulead/lead_s23b.sh $OUT/
git log --oneline -1 > $OUT/rev.txt 2>/dev/null
PYTHONPATH=$PWD:/tmp/wh timeout 230 python3 benchmarks/programs/graph_eager_probe.py --device cuda --config benchmarks/configs/llama3-8b.json --load-format dummy --tokenizer $T --max-total-tokens 400000 --settings default --rounds 6 --deadline-s 150 --json $OUT/probe.json > $OUT/probe.log 2>&1; echo rc $?
grep -v "^\s*$" $OUT/probe.log | grep -v Warning | tail -60 | cut -c1-220
