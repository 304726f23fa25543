#!/usr/bin/env bash
# Download wheels of radixflow's runtime dependencies that an offline GPU host lacks
# (CPython 3.12, manylinux x86_64), into one folder, and print the install line.
#
#   scripts/offline_wheels.sh [--set engine|server] [--have FREEZE_FILE] [DEST]
#   scripts/offline_wheels.sh --check   only check that the two sets cover pyproject.toml's dependencies
#
#   --set engine   what `radixflow.Engine` needs (default); must stay under 64 MiB
#   --set server   engine + the HTTP server (pyzmq, fastapi, uvicorn, pydantic, ...)
#   --have FILE    the target's `python3 -m pip list --format=freeze`; packages named there
#                  are skipped (torch and NVIDIA libraries are always skipped).
#                  scripts/h200-image-freeze.txt is this workplace's H200 image (2026-11-30):
#                  with it the engine set is gguf, interegular, outlines-core, llguidance (5 MiB)
#   DEST           output folder (default: .whl)
#
# Versions are the ones installed in this checkout's venv (the tested ones); the
# dependency closure is read from that venv's package metadata.
set -euo pipefail
cd "$(dirname "$0")/.."
SET=engine HAVE="" DEST=.whl CHECK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --set) SET="$2"; shift 2 ;;
    --have) HAVE="$2"; shift 2 ;;
    --check) CHECK=1; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) DEST="$1"; shift ;;
  esac
done
PY=${PYTHON:-.venv/bin/python}
ENGINE="transformers tokenizers safetensors accelerate numpy gguf tqdm regex interegular outlines-core llguidance"
SERVER="pyzmq fastapi uvicorn pydantic orjson prometheus-client httpx"
ROOTS="$ENGINE"; [ "$SET" = server ] && ROOTS="$ENGINE $SERVER"
# every runtime dependency pyproject.toml declares must be in one of the two sets (llguidance, the default
# grammar backend, was missing until session 23, so a hand-picked wheel older than its pin went to the GPU)
"$PY" - "$ENGINE $SERVER" <<'PYEOF'
import re, sys
sys.path.insert(0, "scripts")
from check_pins import requirements
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
declared = {norm(r.name) for r in requirements()}
missing = sorted(declared - {norm(n) for n in sys.argv[1].split()} - {"torch"})
if missing:
    sys.exit(f"scripts/offline_wheels.sh: pyproject.toml's dependencies {missing} are in neither ENGINE nor SERVER; add them")
PYEOF
[ "$CHECK" = 1 ] && { echo "ENGINE and SERVER cover pyproject.toml's dependencies"; exit 0; }

# name==version lines for the closure of ROOTS, minus what the target has
PINS=$("$PY" - "$HAVE" $ROOTS <<'PYEOF'
import re, sys
from importlib import metadata
from packaging.requirements import Requirement

def norm(n): return re.sub(r"[-_.]+", "-", n).lower()
have = set()
if sys.argv[1]:
    for line in open(sys.argv[1]):
        m = re.match(r"\s*([A-Za-z0-9_.\-]+)", line)
        if m: have.add(norm(m.group(1)))
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
skip = lambda n: n in have or n == "torch" or n.startswith(("nvidia-", "triton"))
todo, seen = [norm(n) for n in sys.argv[2:]], {}
while todo:
    n = todo.pop()
    if n in seen or skip(n):
        continue
    try:
        dist = metadata.distribution(n)
    except metadata.PackageNotFoundError:
        sys.exit(f"{n} is not installed in this venv; install it first (its version is pinned from here)")
    seen[n] = dist.version
    for r in dist.requires or []:
        req = Requirement(r)
        if req.marker is None or req.marker.evaluate(env):
            todo.append(norm(req.name))
print("\n".join(f"{n}=={v}" for n, v in sorted(seen.items())))
PYEOF
)
mkdir -p "$DEST"
PLATS=""
for n in 2_17 2_24 2_27 2_28 2_31 2_34 2_35; do PLATS="$PLATS --platform manylinux_${n}_x86_64"; done
echo "$PINS" | while read -r pin; do
  [ -z "$pin" ] && continue
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    $PLATS --platform manylinux2014_x86_64 --platform any -d "$DEST" "$pin"
done
BYTES=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
echo "wheels: $(ls "$DEST"/*.whl | wc -l) files, $((BYTES / 1048576)) MiB in $DEST (set: $SET)"
if [ "$SET" = engine ] && [ "$BYTES" -gt $((64 * 1048576)) ]; then
  echo "warning: the engine set is over 64 MiB; pass --have with the target's package list" >&2
fi
echo "install on the target (no network), from the repository root; it checks every pin too:"
echo "  source scripts/gpu_site.sh $DEST /tmp/site || exit 3"
