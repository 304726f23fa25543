# On an offline GPU host, from the repository root: install the wheels of scripts/offline_wheels.sh into a fresh
# folder, put it on PYTHONPATH, and check every pyproject.toml dependency against its pin (scripts/check_pins.py).
# Source it, then stop if it failed:
#
#   source scripts/gpu_site.sh .whl /tmp/site || exit 3
#
# The folder is emptied first: `pip install --target` into a folder that holds a package keeps the old one.
_wheels=${1:-.whl} _site=${2:-/tmp/site}
rm -rf "$_site"
python3 -m pip install -q --no-deps --no-index --no-compile --target "$_site" "$_wheels"/*.whl > /dev/null
export PYTHONPATH="$PWD:$_site${PYTHONPATH:+:$PYTHONPATH}"
python3 scripts/check_pins.py
