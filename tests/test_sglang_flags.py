"""SGLang's launch flags in `radixflow serve`: its other names for our flags, the flags whose behaviour is
always on, clear refusals of the rest, and the serving flags radixflow implements (--chat-template,
--stream-response-default-include-usage, --log-requests), the last end to end on a server started with an
SGLang-style command."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import httpx
import pytest

from radixflow.__main__ import serve_args
from radixflow.errors import ModelPathError, RadixflowError
from radixflow.model_files import read_chat_template, resolve_model
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.server.openai_request import _stream_flags
from radixflow.runtime.server.request_log import finished_line
from radixflow.runtime.server_args import ServerArgs
from radixflow.runtime.sglang_flags import ALWAYS, REFUSED

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")  # fmt: skip


def _refusal(capsys, argv: list) -> str:
    with pytest.raises(SystemExit) as e:
        serve_args(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_sglangs_other_names_set_radixflows_flags():
    args = serve_args(["--model", "/m", "--tensor-parallel-size", "1", "--data-parallel-size", "1",
                       "--cuda-graph-max-bs-decode", "8", *ALWAYS])  # fmt: skip
    assert (args.model_path, args.tp_size, args.dp_size, args.cuda_graph_max_bs) == ("/m", 1, 1, 8)


@pytest.mark.parametrize("flag", sorted(REFUSED))
def test_each_of_sglangs_other_flags_is_refused_saying_what_radixflow_does_instead(capsys, flag):
    err = _refusal(capsys, ["--port", "1", flag, "1"])
    assert f"{flag} is SGLang's: radixflow {REFUSED[flag]}" in err


def test_an_unknown_flag_is_named(capsys):
    assert "unrecognized arguments: --no-such-flag" in _refusal(capsys, ["--no-such-flag"])


def test_serve_help_lists_sglangs_flags(capsys):
    with pytest.raises(SystemExit):
        serve_args(["--help"])
    shown = capsys.readouterr().out
    assert all(flag in shown for flag in [*ALWAYS, *REFUSED, "--model MODEL_PATH", "--tensor-parallel-size"])


def test_sglangs_names_for_values_are_taken_and_its_xgrammar_is_refused_saying_what_to_use(capsys):
    args = serve_args(["--dtype", "half", "--tool-call-parser", "qwen25", "--grammar-backend", "none"])
    assert (args.dtype, args.tool_call_parser, args.grammar_backend) == ("float16", "qwen25", "none")
    assert ServerArgs(dtype="float").dtype == "float32" and ServerArgs(dtype="float").to_cli() == ["--dtype", "float32"]
    assert "drop --enable-one-shot-allreduce" in _refusal(capsys, ["--disable-custom-all-reduce",
                                                                   "--enable-one-shot-allreduce"])
    err = _refusal(capsys, ["--grammar-backend", "xgrammar"])
    assert "--grammar-backend xgrammar is SGLang's: radixflow has no xgrammar backend" in err
    with pytest.raises(RadixflowError, match="choose llguidance or outlines"):
        ServerArgs(grammar_backend="xgrammar")


def test_sglangs_sampling_params_for_features_radixflow_lacks_pass_at_their_off_values():
    off = {"beam_width": 1, "watermark": None, "custom_params": None, "spaces_between_special_tokens": True}
    assert SamplingParams.from_dict({"max_new_tokens": 3, **off}).max_new_tokens == 3
    for name, value in (("beam_width", 4), ("watermark", {"gamma": 0.5}), ("custom_params", {"thinking_budget": 8})):
        with pytest.raises(RadixflowError, match=f"{name}=.* is not supported by radixflow"):
            SamplingParams.from_dict({name: value})


def test_a_chat_template_is_a_jinja_file_or_a_chat_template_json(tmp_path, capsys):
    jinja, js, bad = tmp_path / "t.jinja", tmp_path / "chat_template.json", tmp_path / "bad.jinja"
    jinja.write_text(TEMPLATE)
    js.write_text(json.dumps({"chat_template": TEMPLATE}))
    bad.write_text("{% for m in messages %}")
    assert read_chat_template(str(jinja)) == read_chat_template(str(js)) == TEMPLATE
    with pytest.raises(ModelPathError, match="not valid Jinja"):
        read_chat_template(str(bad))
    (tmp_path / "empty.json").write_text("{}")
    with pytest.raises(ModelPathError, match="chat_template"):
        read_chat_template(str(tmp_path / "empty.json"))
    with pytest.raises(RadixflowError, match="not a file"):
        ServerArgs(chat_template="chatml")  # SGLang's built-in names are not files
    assert "not valid Jinja" in _refusal(capsys, ["--chat-template", str(bad)])


def test_openai_streams_take_the_servers_default_for_usage():
    assert _stream_flags({"stream": True}) == (True, False, False)  # (stream, include_usage, continuous_usage_stats)
    assert _stream_flags({"stream": True}, usage_default=True) == (True, True, False)
    assert _stream_flags({"stream": True, "stream_options": {"include_usage": False}}, usage_default=True) == (True, False, False)
    with pytest.raises(RadixflowError, match="stream_options"):
        _stream_flags({"stream": True, "stream_options": {"include_usage": "yes"}}, usage_default=True)


def test_request_log_lines_grow_with_the_level():
    req = SimpleNamespace(origin_input_ids=[1, 2, 3], sampling=SamplingParams.from_dict({"temperature": 0, "max_new_tokens": 7}))
    out = SimpleNamespace(rid="r1", prompt_tokens=3, cached_tokens=1, output_ids=[5, 6], finish_reason={"type": "length"})
    lines = [finished_line(level, req, out, "x" * 5000, 0.25, lambda ids: "input " * 1000) for level in range(4)]
    assert lines[0] == ('finished rid=r1 prompt_tokens=3 cached_tokens=1 completion_tokens=2 '
                        'finish_reason={"type": "length"} e2e_s=0.250')  # fmt: skip
    assert '"temperature": 0' in lines[1] and '"max_new_tokens": 7' in lines[1] and "input=" not in lines[1]
    assert len(lines[2]) < len(lines[3]) and lines[3].endswith('x' * 5000 + '"') and "input=" in lines[2]


def test_generation_config_sampling_settings_are_read_where_set(tmp_path):
    from radixflow.model_files import generation_defaults

    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_k": 20, "do_sample": True,
                                                                 "top_p": None, "min_p": "x", "eos_token_id": 2}))  # fmt: skip
    assert generation_defaults(str(tmp_path)) == {"temperature": 0.6, "top_k": 20}
    assert generation_defaults(str(tmp_path / "missing")) == {} and generation_defaults(None) == {}


def _model_with_generation_config(folder, settings: dict) -> str:
    """The default model's files linked into `folder`, with a generation_config.json that sets `settings`."""
    from radixflow.model_files import convert_gguf, default_gguf_path

    source = convert_gguf(default_gguf_path())
    for name in os.listdir(source):
        if name != "generation_config.json" and not name.startswith("."):
            os.symlink(os.path.join(source, name), folder / name)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, **settings}))
    return str(folder)


@pytest.fixture(scope="module")
def sglang_style_server(tmp_path_factory):
    from serving_helpers import start_server

    path = tmp_path_factory.mktemp("tpl") / "template.jinja"
    path.write_text(TEMPLATE)
    model = _model_with_generation_config(tmp_path_factory.mktemp("model"), {"temperature": 0.0})  # greedy unless asked
    s = start_server("--model", model, "--trust-remote-code", "--enable-metrics", "--enable-cache-report",
                     "--tensor-parallel-size", "1", "--chat-template", str(path), "--stream-response-default-include-usage",
                     "--log-requests", "--log-requests-level", "3", "--max-total-tokens", "8192")  # fmt: skip
    yield s
    s.stop()


def test_a_server_started_with_sglangs_flags_renders_logs_and_reports_as_asked(sglang_style_server, tokenizer):
    s = sglang_style_server
    client = httpx.Client(base_url=s.url, headers={"Authorization": f"Bearer {s.api_key}"}, timeout=120)
    assert client.get("/get_model_info").json()["chat_template"] == TEMPLATE
    body = {"model": "default", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 3, "temperature": 0}
    r = client.post("/v1/chat/completions", json=body).json()
    prompt = "<|user|>Say hi\n<|assistant|>"  # the template's rendering, not the model's own template
    assert r["usage"]["prompt_tokens"] == len(tokenizer.encode(prompt, add_special_tokens=False))
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as resp:
        chunks = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    assert chunks[-1]["usage"]["completion_tokens"] == r["usage"]["completion_tokens"]  # the default: a usage chunk
    with client.stream("POST", "/v1/chat/completions",
                       json={**body, "stream": True, "stream_options": {"include_usage": False}}) as resp:
        chunks = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    assert all(c.get("usage") is None for c in chunks)
    logged = [line for line in s.log().splitlines() if "finished rid=" in line]
    assert len(logged) == 3 and all(json.dumps(prompt) in line for line in logged)
    # the model's generation_config sets temperature 0: requests that leave it out are greedy, sampled if they ask
    plain = {"model": "default", "prompt": "Once upon a time", "max_tokens": 12, "top_p": 1.0}
    greedy = [client.post("/v1/completions", json=plain).json()["choices"][0]["text"] for _ in range(2)]
    explicit = client.post("/v1/completions", json={**plain, "temperature": 0}).json()["choices"][0]["text"]
    assert greedy == [explicit, explicit]
    sampled = {client.post("/v1/completions", json={**plain, "temperature": 1.5, "seed": k}).json()["choices"][0]["text"]
               for k in range(3)}  # fmt: skip
    assert len(sampled) > 1
    from radixflow.lang.backends.runtime_endpoint import RuntimeEndpoint

    endpoint = RuntimeEndpoint(s.url, api_key=s.api_key)  # programs on this server render roles with its template
    assert endpoint.tokenizer.chat_template == TEMPLATE
    endpoint.close()
