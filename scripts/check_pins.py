"""Whether this interpreter's packages satisfy pyproject.toml's runtime dependencies (their version pins).

    python3 scripts/check_pins.py        # exits 1 naming each installed package outside its pin

For a host that got its packages another way than `pip install -e .` (an offline GPU host: wheels from
scripts/offline_wheels.sh on PYTHONPATH, see scripts/gpu_site.sh), so an older package fails here, at once,
instead of minutes into a run (session 23 carried llguidance 1.6.1 against the >=1.9.1 pin and lost two runs).
A package that is not installed is listed but does not fail: offline_wheels.sh's engine set leaves out the
server's, and an import that needs one fails at once anyway.
"""

from __future__ import annotations

import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def requirements(pyproject: Path = PYPROJECT) -> list[Requirement]:
    """pyproject.toml's runtime dependencies (scripts/offline_wheels.sh reads them here too)."""
    return [Requirement(line) for line in tomllib.loads(pyproject.read_text())["project"]["dependencies"]]


def check(pyproject: Path = PYPROJECT) -> tuple[list[str], list[str]]:
    """(installed packages outside their pin, declared packages not installed), a line each."""
    wrong, missing = [], []
    for req in requirements(pyproject):
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            missing.append(f"{req.name}: not installed (pyproject wants {req})")
            continue
        if not req.specifier.contains(version, prereleases=True):
            wrong.append(f"{req.name} {version} is installed; pyproject wants {req}")
    return wrong, missing


def main() -> int:
    wrong, missing = check()
    for line in missing + wrong:
        print(line, file=sys.stderr)
    if not wrong:
        print(f"every installed dependency of {PYPROJECT.name} is within its pin ({len(missing)} not installed)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
