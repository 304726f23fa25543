"""A model's weights: read from its safetensors files, or random ones from its config alone.
Finding the files (HF directory, .gguf, the embedded default) is radixflow/model_files.py."""

from __future__ import annotations

import glob
import os
from typing import Iterator

import torch

from radixflow.errors import ModelPathError


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
