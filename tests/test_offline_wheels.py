"""scripts/offline_wheels.sh (the wheels a GPU host without PyPI gets): its two dependency sets cover every
runtime dependency pyproject.toml declares, and a dependency added to pyproject alone is caught. `--check`
downloads nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def check(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(["bash", str(root / "scripts" / "offline_wheels.sh"), "--check"], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_the_wheel_sets_cover_pyproject():
    out = check(ROOT)
    assert out.returncode == 0, out.stderr
    assert "cover pyproject.toml's dependencies" in out.stdout


def test_a_dependency_in_neither_set_is_named(tmp_path):
    (tmp_path / "scripts").mkdir()
    for script in ("offline_wheels.sh", "check_pins.py"):  # the first reads pyproject through the second
        shutil.copy(ROOT / "scripts" / script, tmp_path / "scripts")
    text = (ROOT / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(text.replace('"tqdm>=4.66",', '"tqdm>=4.66",\n    "no-such-dep>=1",'))
    out = check(tmp_path)
    assert out.returncode != 0 and "['no-such-dep'] are in neither ENGINE nor SERVER" in out.stderr


def test_check_pins_names_a_package_outside_its_pin(tmp_path):
    """scripts/check_pins.py (what scripts/gpu_site.sh runs on a GPU host after installing the wheels): this
    venv passes; a pin this venv misses fails naming the package and both versions; a package that is not
    installed is listed without failing."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_pins.py")], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "check_pins.py", tmp_path / "scripts")
    text = (ROOT / "pyproject.toml").read_text()
    assert '"llguidance>=1.9.1,<2",' in text
    text = text.replace('"llguidance>=1.9.1,<2",', '"llguidance>=99",\n    "no-such-package>=1",')
    (tmp_path / "pyproject.toml").write_text(text)
    out = subprocess.run([sys.executable, str(tmp_path / "scripts" / "check_pins.py")], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 1
    assert "pyproject wants llguidance>=99" in out.stderr and "no-such-package: not installed" in out.stderr
