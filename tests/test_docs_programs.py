"""The examples of docs/programs.md, run in order in one namespace on the shared Engine."""

from __future__ import annotations

import os
import re

import radixflow as rf

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "programs.md")


def blocks() -> list[str]:
    with open(DOC) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def test_docs_examples_run(engine, monkeypatch, capsys):
    monkeypatch.setattr(rf, "Engine", lambda *a, **k: engine, raising=False)  # no second model load
    ns: dict = {}
    try:
        for code in blocks():
            exec(compile(code, DOC, "exec"), ns)
    finally:
        rf.set_default_backend(None)
    assert len(blocks()) == 3
    assert ns["states"][0].mode == "eager" and ns["states"][0]["river"]
    assert "Paris" in ns["states"][0]["answer"] and "Paris" not in ns["states"][1]["answer"]
    printed = capsys.readouterr().out
    assert printed.startswith(" Paris graph\n")
    assert ns["state"]["answer"] == " Rome" and printed.endswith("\n Rome")  # the streamed chunks add up
