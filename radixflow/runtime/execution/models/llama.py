"""One Llama-family decoder driven by the HF config.

Covers Llama 2/3, SmolLM2, Mistral (full attention), Qwen2 (qkv bias) and Qwen3
(per-head q/k RMSNorm), with tied or untied embeddings. Q/K/V and gate/up are fused
into one matmul each; `load_weights` maps the checkpoint's names onto them.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from radixflow.runtime.execution.attention.base import AttentionBackend
from radixflow.runtime.execution.forward_batch import ForwardBatch, ForwardMode
from radixflow.runtime.execution.layers.fp8_linear import Fp8Checkpoint, QuantizationError, prepare_fp8_linears, quantize_linears
from radixflow.runtime.execution.layers.norm import RMSNorm
from radixflow.runtime.execution.layers.norm_fold import fold_norms, settings_off_reason
from radixflow.runtime.execution.layers.parallel_linear import (
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
    choose_small_batch_matmuls,
    load_param,
    merged_column_parallel_linear,
    qkv_parallel_linear,
    row_parallel_linear,
)
from radixflow.runtime.execution.layers.rotary import RotaryEmbedding
from radixflow.runtime.execution.models.llama_epilogue import forward_with_epilogues, takes_epilogues
from radixflow.kernels.settings import KernelSettings

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)

# checkpoint name fragment -> (fused parameter fragment, shard id)
_FUSED = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


# checkpoint names of calibrated FP8 KV-cache scales, under a layer's self_attn (vLLM / llm-compressor styles)
_KV_SCALE_NAMES = {"k_scale": "k", "v_scale": "v", "k_proj.output_scale": "k", "v_proj.output_scale": "v"}


def _checkpoint_module(name: str) -> str:
    """A checkpoint module name behind one of our modules (a fused layer: its first part's)."""
    for frag, (fused, _) in _FUSED.items():
        if name.endswith(fused):
            return "model." + name[: -len(fused)] + frag
    return "model." + name


class ModelShape:
    """Sizes read off the config, in one place."""

    def __init__(self, config):
        self.hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or self.hidden // self.num_heads
        self.intermediate = config.intermediate_size
        self.num_layers = config.num_hidden_layers
        self.vocab_size = config.vocab_size
        self.eps = config.rms_norm_eps
        model_type = getattr(config, "model_type", "llama")
        self.qkv_bias = model_type == "qwen2" or bool(getattr(config, "attention_bias", False))
        self.qk_norm = model_type == "qwen3"
        self.mlp_bias = bool(getattr(config, "mlp_bias", False))
        self.tie_embeddings = bool(getattr(config, "tie_word_embeddings", False))


class Attention(nn.Module):
    def __init__(self, config, shape: ModelShape, layer_id: int, rotary: RotaryEmbedding):
        super().__init__()
        self.s = shape
        self.layer_id = layer_id
        hd = shape.head_dim
        self.qkv_proj = qkv_parallel_linear(shape.hidden, hd, shape.num_heads, shape.num_kv_heads, shape.qkv_bias)
        heads = self.qkv_proj.heads  # this rank's query and KV heads (all of them with tp=1)
        self.num_heads, self.num_kv_heads = heads.q_heads, heads.kv_heads
        self.q_size, self.kv_size = heads.q_heads * hd, heads.kv_heads * hd
        self.o_proj = row_parallel_linear(shape.num_heads * hd, shape.hidden, False, heads.q_start * hd, self.q_size)
        if shape.qk_norm:
            self.q_norm = RMSNorm(shape.head_dim, shape.eps)
            self.k_norm = RMSNorm(shape.head_dim, shape.eps)
        self.rotary = rotary

    def forward(self, positions, x, fb: ForwardBatch, backend: AttentionBackend):
        return self.o_proj(self.attend(positions, self.qkv_proj(x), fb, backend))

    def attend(self, positions, qkv, fb: ForwardBatch, backend: AttentionBackend):
        """Attention from the projected q, k, v to the heads' outputs [T, heads * head_dim], before o_proj."""
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.s.head_dim)
        k = k.view(-1, self.num_kv_heads, self.s.head_dim)
        v = v.view(-1, self.num_kv_heads, self.s.head_dim)
        if self.s.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        out = backend.forward_rotary(positions, q, k, v, self.rotary, self.layer_id, fb)
        return out.reshape(-1, self.q_size)


class MLP(nn.Module):
    def __init__(self, shape: ModelShape):
        super().__init__()
        self.kernels: KernelSettings | None = None  # SiLU-and-mul through the Triton kernel, so launched, on CUDA
        self.interleaved = False  # gate_up's rows as (gate i, up i) pairs (layers/norm_fold.py)
        inter = shape.intermediate
        self.gate_up_proj = merged_column_parallel_linear(shape.hidden, [inter, inter], shape.mlp_bias)
        self.down_proj = row_parallel_linear(inter, shape.hidden, shape.mlp_bias)

    def forward(self, x):
        gate_up = self.gate_up_proj(x)
        if self.kernels is not None and gate_up.is_cuda:
            from radixflow.kernels.norm_act import silu_and_mul

            quantize = self.down_proj.takes_fp8_rows(gate_up)  # down's input: gate_up's rows, device and dtype
            return self.down_proj(silu_and_mul(gate_up, self.kernels, self.interleaved, quantize=quantize))
        if self.interleaved:
            gate, up = gate_up.unflatten(-1, (-1, 2)).unbind(-1)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config, shape: ModelShape, layer_id: int, rotary: RotaryEmbedding):
        super().__init__()
        # The residual stream's dtype (None: the model's). float32 by default because a bf16 stream
        # rounds at each of the 2 adds per layer, which was the largest bf16 error source measured
        # (benchmarks/bf16_error_sources.py); it costs 4 bytes per hidden value, not weight reads.
        self.residual_dtype: torch.dtype | None = torch.float32
        self.self_attn = Attention(config, shape, layer_id, rotary)
        self.mlp = MLP(shape)
        self.input_layernorm = RMSNorm(shape.hidden, shape.eps)
        self.post_attention_layernorm = RMSNorm(shape.hidden, shape.eps)

    def forward(self, positions, x, residual, fb, backend):
        # FP8 GEMMs after the norms get their rows quantized by the norm kernels (kernels/norm_act.py)
        quantize = self.self_attn.qkv_proj.takes_fp8_rows(x)
        if residual is None:
            residual = x if self.residual_dtype is None else x.to(self.residual_dtype)
            h = self.input_layernorm(x, quantize=quantize)
        else:
            h, residual = self.input_layernorm(x, residual, quantize=quantize)
        h = self.self_attn(positions, h, fb, backend)
        h, residual = self.post_attention_layernorm(h, residual, quantize=self.mlp.gate_up_proj.takes_fp8_rows(h))
        return self.mlp(h), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, config, max_positions: int):
        super().__init__()
        self.config = config
        self.shape = s = ModelShape(config)
        rotary = RotaryEmbedding(config, s.head_dim, max_positions)
        self.embed_tokens = VocabParallelEmbedding(s.vocab_size, s.hidden)
        self.layers = nn.ModuleList(DecoderLayer(config, s, i, rotary) for i in range(s.num_layers))
        self.norm = RMSNorm(s.hidden, s.eps)
        self.lm_head = None if s.tie_embeddings else ParallelLMHead(s.vocab_size, s.hidden)
        self.rotary = rotary
        self.folded = False  # the norms' weights folded into qkv / gate_up (fold_norms)
        self.epilogue_on = False  # decode batches on the GEMV path run models/llama_epilogue.py's pass

    def set_kernel_settings(self, settings: KernelSettings, fused: bool) -> None:
        """Hand every layer its kernel choices (the model runner does, before capturing CUDA graphs,
        which bake them in). `fused`: RMSNorm, rotary and SiLU-and-mul through the Triton kernels.
        Deterministic inference (settings.batch_invariant) puts every linear layer and the output head
        on kernels/matmul.py, and RMSNorm on its Triton kernel (one program a row) with any attention
        backend: torch's mean picks its reduction order by the tensor's shape (a 4,096-wide row's mean
        changed with the row count), and the torch-native engine failed
        tests/test_kernels.py::test_gpu_deterministic_inference_is_batch_invariant until this."""
        self.epilogue_on = settings_off_reason(settings, fused) is None  # takes_epilogues also needs the fold
        for m in self.modules():
            if isinstance(m, (RMSNorm, RotaryEmbedding, MLP)):
                m.kernels = settings if fused or (settings.batch_invariant and isinstance(m, RMSNorm)) else None
            if isinstance(m, DecoderLayer):
                m.residual_dtype = torch.float32 if settings.fp32_residual else None
            if isinstance(m, (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding)):
                m.kernels = settings
                m.batch_invariant = settings.batch_invariant

    def choose_small_batch_matmuls(self, settings: KernelSettings) -> dict[str, int]:
        """CUDA: per linear shape, use the Triton GEMV for decode-sized batches where it times
        faster than cuBLAS (the output head has its own float32 path). Call before capturing CUDA graphs."""
        linears = [m for m in self.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
        return choose_small_batch_matmuls(linears, settings)

    def local_heads(self) -> tuple[int, int]:
        """(query heads, KV heads) this tensor-parallel rank computes and caches."""
        attn = self.layers[0].self_attn
        return attn.num_heads, attn.num_kv_heads

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def forward(self, fb: ForwardBatch, backend: AttentionBackend) -> torch.Tensor:
        """Returns the final hidden states of the rows in `fb.logits_indices`."""
        if takes_epilogues(self, fb):
            return forward_with_epilogues(self, fb, backend)
        x = self.embed_tokens(fb.input_ids)
        residual = None
        self.rotary.new_pass()
        for layer in self.layers:
            x, residual = layer(fb.positions, x, residual, fb, backend)
        if fb.mode != ForwardMode.DECODE:  # decode keeps every row: no gather (two kernels in each graph)
            x = x[fb.logits_indices]
            residual = residual[fb.logits_indices]
        h, _ = self.norm(x, residual)
        return h

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """float32 logits over all of the vocabulary, into `out` when given."""
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        return head.logits(hidden, out)

    # -- weights -----------------------------------------------------------------------
    def fold_norms(self) -> None:
        """The norms' weights into qkv / gate_up, gate_up interleaved (layers/norm_fold.py); before quantizing."""
        fold_norms(self)

    def quantize_fp8(self) -> int:
        """--quantization fp8 on loaded weights: every linear layer to e4m3 with per-row scales."""
        return quantize_linears(self)

    def prepare_fp8(self, ckpt: Fp8Checkpoint) -> int:
        """FP8 parameters for a pre-quantized checkpoint to load into (layers/fp8_linear.py)."""
        return prepare_fp8_linears(self, ckpt, _checkpoint_module)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        assert not self.folded, "checkpoint weights into a folded model (norm weights gone, gate_up interleaved)"
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        self.kv_cache_scales: dict[int, dict[str, torch.Tensor]] = {}  # layer -> {"k"|"v": calibrated FP8 KV scale}
        for name, tensor in weights:
            name = name.removeprefix("model.")
            if "rotary_emb" in name or name.endswith(".input_scale"):
                continue  # activations are quantized per token at run time, whatever static scale was calibrated
            kv = _KV_SCALE_NAMES.get(name.split(".self_attn.")[-1]) if ".self_attn." in name else None
            if kv:
                self.kv_cache_scales.setdefault(int(name.split(".")[1]), {})[kv] = tensor.float()
                continue
            if name == "lm_head.weight" and self.lm_head is None:
                continue  # tied: the embedding is the head
            target, shard = name, None
            for frag, (fused, sid) in _FUSED.items():
                if f".{frag}." in name:
                    target, shard = name.replace(frag, fused), sid
                    break
            if target not in params:
                raise ValueError(f"checkpoint tensor {name!r} has no place in {type(self).__name__}")
            if tensor.dtype == torch.float8_e4m3fn and params[target].dtype != tensor.dtype:
                raise QuantizationError(f"checkpoint tensor {name!r} is FP8 but its config.json declares no FP8 "
                                        "quantization_config for it (quant_method fp8 or compressed-tensors)")
            load_param(params[target], tensor, shard)  # this rank's slice (parallel_linear.py)
            loaded.add(target if shard is None else f"{target}:{shard}")
        missing = [n for n in params if n not in loaded and not any(k.startswith(n + ":") for k in loaded)]
        if missing:
            raise ValueError(f"checkpoint lacks weights for: {', '.join(missing[:5])}")
