"""SGLang's own frontend test programs, unchanged but for `import radixflow as sgl`, on the
in-process Engine. The cheap ones run here; `python tests/sglang_programs.py` runs the
whole file (docs/programs.md, "SGLang programs", gives the count and why the rest fail)."""

from __future__ import annotations

import pytest

import radixflow as rf

pytest.importorskip("sglang", reason="sglang frontend not installed (pip install --no-deps sglang==0.5.23)")
import sglang_programs  # noqa: E402

CHEAP = ["test_select", "test_tool_use", "test_stream_logprobs", "test_regex", "test_chat_completion_speculative"]


@pytest.fixture(scope="module")
def default_engine(engine):
    rf.set_default_backend(engine)
    yield engine
    rf.set_default_backend(None)


@pytest.mark.parametrize("name", CHEAP)
def test_sglang_program_runs_unchanged(default_engine, name):
    assert sglang_programs.run_all([name]) == {name: "pass"}


def test_parallel_encoding_joins_by_concatenation(default_engine):
    mod = sglang_programs.load()
    mod.test_parallel_encoding(check_answer=False)  # the 135M model does not always answer "Noah"
