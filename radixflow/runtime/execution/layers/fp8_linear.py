"""FP8 (e4m3) weights for the linear layers: `--quantization fp8` and pre-quantized checkpoints.

A quantized layer keeps `weight` as float8_e4m3fn [N, K] and `weight_scale` float32 [N], one scale
per output channel; activations are quantized per token at each call (kernels/fp8.py), whatever
static `input_scale` a checkpoint carries. The embedding, the output head and the norms stay in the
model's dtype. Two ways in:

- a bf16/fp32 checkpoint (or dummy weights) with `--quantization fp8`: loaded as usual, then each
  linear layer's rows are quantized (`quantize_linears`);
- a checkpoint whose config.json has a `quantization_config` (`read_checkpoint_quantization`):
  quant_method "fp8" (per-tensor or per-channel `weight_scale`) or "compressed-tensors" with 8-bit
  float weights ("tensor" or "channel" strategy). The layers get FP8 parameters first
  (`prepare_fp8_linears`) and the checkpoint's tensors are copied in; a per-tensor scale becomes
  the same scale on each of its rows, so fused q/k/v (gate/up) keep each part's own scale.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from typing import Iterable

import torch
from torch import nn

from radixflow.errors import RadixflowError
from radixflow.kernels.reference import FP8, quantize_rows_torch
from radixflow.runtime.execution.layers.parallel_linear import ColumnParallelLinear, RowParallelLinear

QUANTIZATIONS = ("fp8",)


class QuantizationError(RadixflowError):
    """A quantization setting or a checkpoint's quantization_config that radixflow cannot serve."""


@dataclass(frozen=True)
class Fp8Checkpoint:
    """What a pre-quantized checkpoint's quantization_config says."""

    method: str  # "fp8" or "compressed-tensors"
    ignore: tuple[str, ...]  # modules left unquantized (names or "re:" patterns)


def _as_dict(qc) -> dict:
    return qc if isinstance(qc, dict) else qc.to_dict()


def read_checkpoint_quantization(config) -> Fp8Checkpoint | None:
    """The checkpoint's FP8 scheme, None for an unquantized one; QuantizationError for schemes not served."""
    qc = getattr(config, "quantization_config", None)
    if not qc:
        return None
    qc = _as_dict(qc)
    method = qc.get("quant_method")
    if method == "fp8":
        if qc.get("weight_block_size"):
            raise QuantizationError("block-wise FP8 checkpoints (weight_block_size) are not supported; "
                                    "use a per-tensor or per-channel FP8 checkpoint, or the bf16 one with --quantization fp8")
        ignore = qc.get("ignored_layers") or qc.get("modules_to_not_convert") or []
        return Fp8Checkpoint("fp8", tuple(ignore))
    if method == "compressed-tensors":
        if qc.get("format") not in ("float-quantized", "naive-quantized"):
            raise QuantizationError(f"compressed-tensors format {qc.get('format')!r} is not supported; "
                                    "radixflow loads 'float-quantized' (FP8) checkpoints")
        for name, group in (qc.get("config_groups") or {}).items():
            w = group.get("weights") or {}
            if w.get("type") != "float" or w.get("num_bits") != 8 or w.get("strategy") not in ("tensor", "channel"):
                raise QuantizationError(f"compressed-tensors group {name!r}: weights {w} are not 8-bit float with a "
                                        "'tensor' or 'channel' strategy, the FP8 schemes radixflow loads")
        return Fp8Checkpoint("compressed-tensors", tuple(qc.get("ignore") or ()))
    raise QuantizationError(f"quantization method {method!r} is not supported; radixflow loads 'fp8' and "
                            "'compressed-tensors' (FP8) checkpoints, or quantizes a bf16 one with --quantization fp8")


def is_ignored(module_name: str, ignore: Iterable[str]) -> bool:
    """Whether a checkpoint module name (e.g. model.layers.0.mlp.down_proj) is on an ignore list."""
    for entry in ignore:
        if entry.startswith("re:"):
            if re.match(entry[3:], module_name):
                return True
        elif module_name == entry or module_name.endswith("." + entry) or module_name.removeprefix("model.") == entry:
            return True
    return False


def _rebind(new: nn.Parameter, old: nn.Parameter) -> None:
    """Give `new` the tensor-parallel loaders `old` had (they are bound to their parameter)."""
    for attr in ("weight_loader", "load_full"):
        fn = getattr(old, attr, None)
        if fn is not None:
            setattr(new, attr, partial(fn.func, new))
    if hasattr(old, "full_shape"):
        new.full_shape = old.full_shape


def _load_scale(layer: nn.Module, param: torch.Tensor, tensor: torch.Tensor, key=None) -> None:
    """A checkpoint's weight_scale (scalar, [1], [N] or [N, 1]) into this rank's per-row scales."""
    flat = tensor.float().reshape(-1)
    if isinstance(layer, ColumnParallelLinear):
        part = next(p for p in layer.parts if key is None or p.key == key)
        layer.load_shard(param, flat.expand(part.total) if flat.numel() == 1 else flat, key)
    else:  # row-parallel: every output row is local
        with torch.no_grad():
            param.copy_(flat.expand(param.numel()) if flat.numel() == 1 else flat)


def _set_fp8(layer: nn.Module, weight: torch.Tensor, scale: torch.Tensor) -> None:
    old = layer.weight
    new = nn.Parameter(weight, requires_grad=False)
    _rebind(new, old)
    layer.weight = new
    layer.weight_scale = nn.Parameter(scale, requires_grad=False)
    layer.weight_scale.weight_loader = partial(_load_scale, layer, layer.weight_scale)


def _linears(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]


@torch.no_grad()
def quantize_linears(model: nn.Module) -> int:
    """Quantize every loaded linear layer's weight to e4m3 with per-row scales, in place; returns the count."""
    layers = _linears(model)
    for _, layer in layers:
        q, s = quantize_rows_torch(layer.weight.data)
        _set_fp8(layer, q, s)
    return len(layers)


def prepare_fp8_linears(model: nn.Module, ckpt: Fp8Checkpoint, checkpoint_name) -> int:
    """Give the linear layers empty FP8 weights and scales for a pre-quantized checkpoint to load into,
    except layers on its ignore list. checkpoint_name(module name) -> a checkpoint module name it holds."""
    count = 0
    for name, layer in _linears(model):
        if is_ignored(checkpoint_name(name), ckpt.ignore):
            continue
        w = layer.weight
        _set_fp8(layer, torch.zeros(w.shape, dtype=FP8, device=w.device),
                 torch.ones(w.shape[0], dtype=torch.float32, device=w.device))
        count += 1
    return count
