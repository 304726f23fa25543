"""SGLang's own frontend test programs, unchanged but for `import radixflow as sgl`, on the
in-process Engine. The cheap ones run here; `python tests/sglang_programs.py` runs the
whole file (docs/programs.md, "SGLang programs", gives the count and why the rest fail)."""

from __future__ import annotations

import pytest

import radixflow as rf
from radixflow.lang.backends import get_default_backend

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


@pytest.mark.parametrize("name", list(sglang_programs.SCRIPTS))
def test_sglang_program_passes_when_the_model_answers_as_expected(name):
    """The programs whose checks the 135M model fails, against a stand-in model that writes
    what they expect: counted apart from the programs that pass on the real model."""
    assert sglang_programs.run_scripted([name]) == {name: "pass"}


def test_gen_min_new_tokens_on_a_runtime(server):
    """SGLang runs it on sgl.Runtime (default_backend.endpoint.get_model_name()); its tokenizer
    helper's module needs torchvision, so transformers' AutoTokenizer stands in for it."""
    from types import SimpleNamespace

    runtime = SimpleNamespace(endpoint=rf.RuntimeEndpoint(server.url, server.api_key))  # a Runtime's shape, on the shared server
    before = get_default_backend()
    rf.set_default_backend(runtime)
    try:
        with sglang_programs.tokenizer_helper_without_torchvision():
            assert sglang_programs.run_all(["test_gen_min_new_tokens"]) == {"test_gen_min_new_tokens": "pass"}
    finally:
        runtime.endpoint.close()
        rf.set_default_backend(before)


# -- API speculative execution (@function(num_api_spec_tokens=N)) -------------------------------------------
def _character(spec_tokens=None):
    def character(s):
        s += "Construct a character within the following format:\n"
        s += "Name: Steve Jobs.\nBirthday: February 24, 1955.\nJob: Apple CEO.\n"
        s += "\nPlease generate new Name, Birthday and Job.\n"
        s += "Name:" + rf.gen("name", stop="\n") + "\nBirthday:" + rf.gen("birthday", stop="\n")
        s += "\nJob:" + rf.gen("job", stop="\n") + "\n"

    return rf.function(num_api_spec_tokens=spec_tokens)(character)


def test_speculation_makes_one_call_where_the_model_writes_the_format(default_engine):
    usage = rf.global_config.default_backend.token_usage  # an Engine's program backend
    usage.reset()
    spec = _character(64).run(temperature=0, max_new_tokens=24)
    spec_prompt = usage.prompt_tokens
    usage.reset()
    plain = _character().run(temperature=0, max_new_tokens=24, mode="eager")
    assert spec.mode == "eager" and spec.get_meta_info("birthday") == {"speculative": True}
    assert spec_prompt == spec.get_meta_info("name")["prompt_tokens"]  # one call
    assert usage.prompt_tokens > 2 * spec_prompt  # three calls, each with the program so far
    assert spec["birthday"] and spec["job"] and "\n" not in spec["job"]
    assert [spec[k] for k in ("name", "birthday", "job")] == [plain[k] for k in ("name", "birthday", "job")]


def test_speculation_falls_back_to_a_call_where_the_model_wrote_something_else():
    b = sglang_programs.ScriptedBackend([
        ("Name:", " Ada\nBorn: 1815\nJob: Mathematician\n"),  # writes "Born", not "Birthday"
        ("\nBirthday:", " 1815\nJob: Mathematician\n"),
        ("\nJob:", " Mathematician and writer\n"),
    ])  # fmt: skip
    s = _character(64).run(backend=b)
    assert [s["name"], s["birthday"], s["job"]] == [" Ada", " 1815", " Mathematician"]
    assert len(b.prompts) == 2  # the second call's speculation served the job
    assert s.get_meta_info("job") == {"speculative": True}


def test_speculation_leaves_gens_without_stop_and_graph_mode_alone(default_engine):
    b = sglang_programs.ScriptedBackend([("A:", " one\nB: two\n"), ("B:", " three")])

    @rf.function(num_api_spec_tokens=32)
    def two(s):
        s += "A:" + rf.gen("a", stop="\n") + "\nB:" + rf.gen("b", max_tokens=4)

    s = two.run(backend=b)
    assert (s["a"], s["b"], len(b.prompts)) == (" one", " three", 2)  # no stop: b is its own call
    assert _character(64).run(temperature=0, max_new_tokens=8, mode="graph").mode == "graph"
    with pytest.raises(rf.RadixflowError, match="num_api_spec_tokens"):
        rf.function(num_api_spec_tokens=0)(lambda s: None)


def test_speculation_on_an_openai_completions_endpoint(server):
    """SGLang's own target: an OpenAI completion model, with token_usage from the responses' usage."""
    oai = rf.OpenAIEndpoint(server.url + "/v1", model="default", api_key=server.api_key)
    spec = _character(64).run(backend=oai, temperature=0, max_new_tokens=24)
    spec_usage = oai.token_usage.prompt_tokens
    oai.token_usage.reset()
    plain = _character().run(backend=oai, temperature=0, max_new_tokens=24)
    assert spec.mode == plain.mode == "eager" and spec_usage > 0
    assert oai.token_usage.prompt_tokens > 2 * spec_usage
    assert spec["birthday"] == plain["birthday"] and spec["job"] == plain["job"]
