"""README's "One validation for every route" examples, run against the test server."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

README = Path(__file__).resolve().parents[1] / "README.md"
CLIENT_LINE = 'client = httpx.Client(base_url="http://127.0.0.1:30000", timeout=120)'


def readme_example() -> str:
    text = README.read_text()
    section = text[text.index("### One validation for every route") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_validation_examples_run(server):
    code = readme_example()
    assert CLIENT_LINE in code
    with server.client() as client:
        exec(compile(code.replace(CLIENT_LINE, ""), "README.md", "exec"), {"client": client, "httpx": httpx})
