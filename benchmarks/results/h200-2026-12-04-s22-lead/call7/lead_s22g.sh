python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/wh .gpulead/.whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/wh
mkdir -p $OUT
cp .gpulead/lead_s22g.sh $OUT/
echo "== $(date +%T) pytest"
timeout 130 python3 -m pytest -q -p no:cacheprovider tests/test_blas_choice.py tests/test_decode_entries.py -k "gpu or lt_rows" > $OUT/pytest.log 2>&1; echo rc $?
tail -15 $OUT/pytest.log
echo "== $(date +%T) end"
