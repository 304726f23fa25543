"""Start-up shortcuts: the tokenizer loaded without AutoTokenizer where that gives the same tokenizer, and the server
loading it (and starting the detokenizer) while the scheduler loads the model; a model that then fails still fails
with its reason."""

from __future__ import annotations

import json
import os
import shutil
import socket
import re
import subprocess
import sys

import pytest

from radixflow.errors import RadixflowError
from radixflow.model_files import _loads_directly, load_tokenizer, ready_model_dir, resolve_model
from radixflow.runtime.server.launch_server import _known_tokenizer_path
from radixflow.runtime.server_args import ServerArgs


@pytest.fixture(scope="module")
def default_dir() -> str:
    return resolve_model(None).path


def test_direct_tokenizer_is_the_one_autotokenizer_loads(default_dir):
    from transformers import AutoTokenizer

    assert _loads_directly(default_dir)
    ours, auto = load_tokenizer(default_dir), AutoTokenizer.from_pretrained(default_dir)
    assert type(ours) is type(auto) and ours.init_kwargs == auto.init_kwargs
    text = "Hello <|im_start|>user\n wörld 12345 <|endoftext|>  two  spaces\t"
    assert ours(text).input_ids == auto(text).input_ids
    assert (len(ours), ours.all_special_ids, ours.eos_token_id) == (len(auto), auto.all_special_ids, auto.eos_token_id)
    chat = [{"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(chat, tokenize=False) == auto.apply_chat_template(chat, tokenize=False)


def _copy_with(src: str, dst, config: dict | None = None, tokenizer_config: dict | None = None) -> str:
    os.makedirs(dst)
    for name in ("config.json", "tokenizer_config.json", "tokenizer.json"):
        shutil.copy(os.path.join(src, name), dst)
    for name, changes in (("config.json", config), ("tokenizer_config.json", tokenizer_config)):
        with open(os.path.join(dst, name)) as f:
            data = json.load(f)
        with open(os.path.join(dst, name), "w") as f:
            json.dump({**data, **(changes or {})}, f)
    return str(dst)


def test_autotokenizer_where_it_may_load_another_class(default_dir, tmp_path):
    """Other model types (transformers replaces qwen2's saved class), custom code and other saved classes go
    through AutoTokenizer."""
    assert _loads_directly(_copy_with(default_dir, tmp_path / "llama"))
    assert not _loads_directly(_copy_with(default_dir, tmp_path / "qwen2", config={"model_type": "qwen2"}))
    auto_map = {"auto_map": {"AutoTokenizer": ["x.Tok", None]}}
    assert not _loads_directly(_copy_with(default_dir, tmp_path / "custom", tokenizer_config=auto_map))
    fast = {"tokenizer_class": "PreTrainedTokenizerFast"}
    assert not _loads_directly(_copy_with(default_dir, tmp_path / "fast", tokenizer_config=fast))
    assert not _loads_directly(str(tmp_path / "missing"))


def test_tokenizer_path_known_before_the_model_loads(default_dir, tmp_path):
    """The folder the scheduler will report: given, a model folder, a converted GGUF, the default model's for a
    dummy model's .json config; None where only loading can tell (a path that does not exist)."""
    assert ready_model_dir(None) == default_dir
    assert _known_tokenizer_path(ServerArgs()) == default_dir
    assert _known_tokenizer_path(ServerArgs(model_path=str(tmp_path))) == str(tmp_path)
    (tmp_path / "tok").mkdir()
    given = str(tmp_path / "tok")
    assert _known_tokenizer_path(ServerArgs(tokenizer_path=given, model_path=str(tmp_path))) == given
    dummy = ServerArgs(model_path=str(tmp_path / "c.json"), load_format="dummy")
    assert _known_tokenizer_path(dummy) == default_dir
    assert _known_tokenizer_path(ServerArgs(model_path=str(tmp_path / "none.gguf"))) is None


def test_a_model_that_fails_after_the_early_tokenizer_still_fails_with_its_reason(default_dir, tmp_path):
    """A folder with a tokenizer but no weights: the detokenizer starts early, the scheduler then refuses the
    folder, and the server exits with the scheduler's reason."""
    bad = _copy_with(default_dir, tmp_path / "no_weights")
    assert _known_tokenizer_path(ServerArgs(model_path=bad)) == bad
    r = subprocess.run([sys.executable, "-m", "radixflow", "serve", "--model-path", bad, "--port", "1"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode != 0
    assert "failed to start" in r.stderr and "lacks *.safetensors weights" in r.stderr


def test_import_and_serve_help_do_not_load_torch():
    """`import radixflow` and `radixflow serve --help` (or a bad flag) stay light: ~0.1 s, not torch's ~3 s; so does
    the detokenizer process's module (it spends its start-up loading the tokenizer, not torch)."""
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "import radixflow\n"
        "import radixflow.runtime.server.detokenizer\n"
        "from radixflow.__main__ import main\n"
        "try:\n"
        "    main(['serve', '--help'])\n"
        "except SystemExit as e:\n"
        "    print('exit', e.code)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "exit 0" in out.stdout and "--model-path" in out.stdout, out.stderr[-2000:]


@pytest.mark.parametrize(
    "kwargs, needle",
    [({"max_prefill_tokens": 0}, "max_prefill_tokens must be >= 1"),  # started, then every request hung
     ({"max_total_tokens": 1}, "max_total_tokens must be >= 64"), ({"max_batch_size": 0}, "max_batch_size must be >= 1"),
     ({"max_new_tokens_limit": -1}, "max_new_tokens_limit must be >= 1"), ({"max_body_bytes": 0}, "max_body_bytes must"),
     ({"grammar_compile_timeout_s": float("nan")}, "grammar_compile_timeout_s must be a positive"),
     ({"log_interval_s": 0.0}, "log_interval_s must be a positive"), ({"stream_interval": 0}, "stream_interval must"),
     ({"grammar_compile_workers": 0}, "grammar_compile_workers must"), ({"context_length": -5}, "context_length must"),
     ({"port": 70000}, "give a TCP port"), ({"random_seed": 10**23}, "random_seed="), ({"api_key": ""}, "api_key is empty"),
     ({"log_level": "junk"}, "log_level='junk'"), ({"tokenizer_path": "/nonexistent"}, "does not exist"),
     ({"dp_size": 10**5}, "more replicas than this host has CPUs"), ({"max_total_tokens": "abc"}, "must be an integer"),
     ({"page_size": "4"}, "page_size='4': must be an integer"), ({"mem_fraction_static": True}, "must be a number"),
     ({"constrained_json_whitespace_pattern": "a*"}, "may match more than JSON whitespace")],
)  # fmt: skip
def test_arguments_no_request_could_run_with_are_refused_before_loading(kwargs, needle):
    """Found by fuzzing the launch flags: each of these started a server that refused, or hung on, every request, or
    failed with a traceback (Engine(...) takes them unchecked by argparse, so types are checked too)."""
    with pytest.raises(RadixflowError, match=re.escape(needle)):
        ServerArgs(**kwargs)
    ServerArgs(constrained_json_whitespace_pattern="[ \n]*")  # JSON whitespace only: fine


def test_a_context_length_over_the_models_own_is_refused():
    """Found by fuzzing: --context-length 99999999 failed in the allocator with a traceback."""
    from types import SimpleNamespace

    from radixflow.runtime.execution.model_runner import _context_len

    config = SimpleNamespace(max_position_embeddings=8192)
    assert (_context_len(None, config), _context_len(4096, config), _context_len(None, SimpleNamespace())) == (8192, 4096, 4096)
    with pytest.raises(RadixflowError, match="over the model's context \\(8192: max_position_embeddings"):
        _context_len(99_999_999, config)
    # rope scaling extends it where the config's length leaves the factor out (review: YaRN was capped at 32,768)
    yarn = SimpleNamespace(max_position_embeddings=32768, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                                        "original_max_position_embeddings": 32768})
    linear = SimpleNamespace(max_position_embeddings=4096, rope_parameters={"rope_type": "linear", "factor": 2.0})
    llama3 = SimpleNamespace(max_position_embeddings=131072, rope_scaling={"rope_type": "llama3", "factor": 8.0})
    assert [_context_len(None, c) for c in (yarn, linear, llama3)] == [131072, 8192, 131072]
    with pytest.raises(RadixflowError, match="131072"):
        _context_len(131073, yarn)


def test_socket_directories_of_killed_servers_are_removed_at_the_next_start(tmp_path):
    """A server killed with SIGKILL leaves its /tmp/radixflow-<pid>-* socket directory (a soak test found hundreds):
    the next start removes this user's whose process is gone, and only those holding nothing but the sockets."""
    from radixflow.runtime.server.server_messages import remove_stale_ipc_dirs

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead, alive, other = (tmp_path / f"radixflow-{gone.pid}-abc", tmp_path / f"radixflow-{os.getpid()}-abc",
                          tmp_path / f"radixflow-{gone.pid}-keep")
    for d in (dead, alive, other):
        d.mkdir()
        for sock in ("sched", "detok", "tok"):
            (d / sock).write_text("")
    (other / "notes.txt").write_text("not ours")
    (tmp_path / "radixflow-server-x.log").write_text("")
    for odd in ("radixflow-99999999999999999999-x", "radixflow-\u00b2-x", "radixflow-7"):  # crashed the start (review)
        (tmp_path / odd).write_text("")
    (tmp_path / f"radixflow-{gone.pid}-link").symlink_to(alive)  # a link is not followed
    listening = tmp_path / f"radixflow-{gone.pid}-listens"  # a server in another pid namespace: its socket accepts
    listening.mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(listening / "sched"))
        server.listen()
        assert remove_stale_ipc_dirs(str(tmp_path)) == 1
    assert not dead.exists() and alive.exists() and other.exists() and (tmp_path / "radixflow-server-x.log").exists()
    assert (alive / "sched").exists() and (listening / "sched").exists()


def test_a_dummy_model_directory_needs_no_weights(default_dir, tmp_path):
    """--load-format dummy with a model folder (config.json and a tokenizer, as SGLang and vLLM take it) was refused
    for lacking *.safetensors, which random weights never read; a folder for real weights still needs them."""
    bare = _copy_with(default_dir, tmp_path / "no_weights")
    assert resolve_model(bare, need_weights=False).path == bare
    with pytest.raises(RadixflowError, match="lacks \\*.safetensors weights"):
        resolve_model(bare)
