"""Tensor-parallel linear layers and embeddings; each rank holds its slice of the weights.

- Column-parallel (fused QKV, merged gate/up): the output rows are split; every logical
  part (q, k, v / gate, up) keeps its own slice, so the fused layout is the same on
  every rank as with tp=1, only narrower.
- Row-parallel (o_proj, down_proj): the input columns are split; the partial outputs
  are summed with an all-reduce, the bias added once after it.
- Vocab-parallel embedding and LM head: vocab rows split (padded to a multiple of
  tp_size); the embedding all-reduces, the head all-gathers the logits.

GQA heads are split by whole KV groups, so every rank keeps the same q-per-kv ratio
that the attention kernels assume: with 9 q / 3 kv heads and tp=2 the ranks hold 6+3 q
heads (2+1 kv heads). With fewer KV heads than ranks each KV head is replicated on
tp/kv ranks. Every parameter carries `weight_loader(tensor, shard_id)` (a checkpoint
tensor, sharded by name) and `load_full(tensor)` (the unsharded fused tensor, for
dummy weights that must match tp=1). With tp_size=1 the layers are plain nn.Linear /
nn.Embedding and compute exactly what they did.

On CUDA, `choose_small_batch_matmuls` may route a layer's local matmul with few rows
(decode) to the Triton GEMV in kernels/gemv.py, where it measured faster than cuBLAS, and a few
dozen rows to cuBLASLt where that measured faster (kernels/blas_choice.py); collectives stay
where they are. With `batch_invariant` set (deterministic inference) every matmul, the output
head's included, goes through kernels/matmul.py instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import Hashable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from radixflow.errors import RadixflowError
from radixflow.kernels import cpu_linear
from radixflow.kernels.blas_choice import NO_LT, LtRows, choose_lt_rows, linear_lt
from radixflow.kernels.settings import DEFAULT_KERNEL_SETTINGS, KernelSettings
from radixflow.runtime.distributed.tp_group import all_gather_last_dim, all_reduce, get_tp

log = logging.getLogger(__name__)


def split_range(total: int, parts: int, index: int) -> tuple[int, int]:
    """(start, size) of slice `index` when `total` is cut into `parts` near-equal slices."""
    base, extra = divmod(total, parts)
    return index * base + min(index, extra), base + (index < extra)


@dataclass(frozen=True)
class HeadSplit:
    q_start: int
    q_heads: int
    kv_start: int
    kv_heads: int


def split_heads(num_heads: int, num_kv_heads: int, tp_size: int, rank: int) -> HeadSplit:
    group = num_heads // num_kv_heads
    if num_kv_heads >= tp_size:  # whole KV groups per rank (uneven when tp does not divide)
        kv_start, kv_n = split_range(num_kv_heads, tp_size, rank)
        return HeadSplit(kv_start * group, kv_n * group, kv_start, kv_n)
    if tp_size % num_kv_heads or num_heads % tp_size:
        raise RadixflowError(
            f"tp_size={tp_size} with {num_kv_heads} KV heads: tp_size must divide by the KV heads "
            f"and divide the {num_heads} query heads; choose tp_size <= {num_kv_heads}"
        )
    q_n = num_heads // tp_size
    return HeadSplit(rank * q_n, q_n, rank * q_n // group, 1)


@dataclass(frozen=True)
class Part:
    """One logical block of a fused dimension: `total` rows in the checkpoint, of which
    this rank holds `size` starting at `start`."""

    key: Hashable
    total: int
    start: int
    size: int


def _attach_loaders(param: nn.Parameter, load, load_full, full_shape: tuple) -> None:
    param.weight_loader = partial(load, param)
    param.load_full = partial(load_full, param)
    param.full_shape = full_shape


def load_param(param: torch.Tensor, tensor: torch.Tensor, shard: Hashable = None) -> None:
    """Copy a checkpoint tensor (or one fused block of it) into this rank's parameter."""
    loader = getattr(param, "weight_loader", None)
    if loader is not None:
        loader(tensor, shard)
        return
    assert shard is None, "a fused parameter without a loader"
    with torch.no_grad():
        param.copy_(tensor)


def load_full_param(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy this rank's slice of an unsharded (fused) tensor shaped like the tp=1 parameter."""
    loader = getattr(param, "load_full", None)
    if loader is not None:
        loader(full)
        return
    with torch.no_grad():
        param.copy_(full)


class SmallBatchMatmul:
    """`matmul`: x @ weight.T (+ bias) through the Triton GEMV for 1..gemv_max_m rows, else F.linear.
    gemv_max_m stays 0 (always F.linear) unless `choose_small_batch_matmuls` measured the GEMV faster."""

    gemv_max_m = 0
    gemv_config: dict | None = None  # the GEMV's launch config (None: its default)
    lt_rows: LtRows = NO_LT  # row counts run through cuBLASLt (kernels/blas_choice.py), set with gemv_max_m
    batch_invariant = False  # every row through kernels/matmul.py (CUDA): the same bits in any batch
    kernels: KernelSettings = DEFAULT_KERNEL_SETTINGS  # how its kernels launch (the model runner's settings)
    weight: torch.Tensor

    def matmul(self, x, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x: a tensor, or rows quantized for this layer (kernels/fp8.Fp8Rows, see `takes_fp8_rows`)."""
        if self.weight.dtype == torch.float8_e4m3fn:
            return self._fp8_matmul(x, bias)
        if self.batch_invariant and x.is_cuda:
            from radixflow.kernels.matmul import matmul_batch_invariant

            return matmul_batch_invariant(x, self.weight, bias)
        if x.dim() == 2 and 0 < x.shape[0] <= self.gemv_max_m:
            from radixflow.kernels.gemv import gemv

            return gemv(x, self.weight, bias, config=self.gemv_config, settings=self.kernels)
        if x.dim() == 2 and self.lt_rows(x.shape[0]) and x.is_cuda and torch.cuda.is_current_stream_capturing():
            return linear_lt(x, self.weight, bias)
        return cpu_linear.linear(x, self.weight, bias)

    def takes_fp8_rows(self, x: torch.Tensor) -> bool:
        """Whether this layer quantizes x's rows per token for torch._scaled_mm (FP8 weights, CUDA, more rows
        than the GEMV takes), so that the kernel making x may hand them over quantized (kernels/fp8.Fp8Rows)."""
        w = self.weight
        if w.dtype != torch.float8_e4m3fn:
            return False
        from radixflow.kernels import fp8

        return (x.is_cuda and x.dim() == 2 and x.shape[0] > self.gemv_max_m and x.dtype == torch.bfloat16
                and fp8.scaled_mm_ok(*w.shape) and self.kernels.fp8_activations and self.kernels.fp8_fused_quantize)

    def _fp8_matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """FP8 weights (layers/fp8_linear.py): the GEMV streams them for few rows, torch._scaled_mm with
        per-token activation scales for more; on CPU (or shapes _scaled_mm refuses) they are dequantized.
        x may come quantized (fp8.Fp8Rows) where `takes_fp8_rows` said so."""
        from radixflow.kernels import fp8

        w, scale = self.weight, self.weight_scale
        if isinstance(x, fp8.Fp8Rows):
            return fp8.fp8_gemm(x, w, bias, scale, self.kernels)
        if x.is_cuda and x.dim() == 2 and 0 < x.shape[0] <= self.gemv_max_m:
            from radixflow.kernels.gemv import gemv

            return gemv(x, w, bias, config=self.gemv_config, w_scale=scale, settings=self.kernels)
        fp8_gemm_ok = x.dtype == torch.bfloat16 and fp8.scaled_mm_ok(*w.shape) and self.kernels.fp8_activations
        if x.is_cuda and x.dim() == 2 and fp8_gemm_ok:
            return fp8.fp8_gemm(x, w, bias, scale, self.kernels)
        if x.is_cuda:
            return F.linear(x, fp8.dequantize(w, scale, x.dtype), bias)
        # CPU: torch converts FP8 element by element (~25 ms per million), so the dequantized
        # weight is kept; it holds exactly the values the FP8 weight stands for
        cached = getattr(self, "_dequantized", None)
        if cached is None or cached.dtype != x.dtype:
            cached = self._dequantized = fp8.dequantize(w, scale, x.dtype)
        return F.linear(x, cached, bias)


_MM_OUT_DTYPE = True  # torch.mm(..., out_dtype=) exists for CUDA half inputs (torch >= 2.8)


_MM_INTO = True  # ... and with out= (mm.dtype_out), straight into a given buffer


def _mm_float32(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    global _MM_OUT_DTYPE
    if _MM_OUT_DTYPE:
        try:
            return torch.mm(x, weight.t(), out_dtype=torch.float32)
        except (RuntimeError, TypeError):
            _MM_OUT_DTYPE = False
            log.warning("torch.mm(out_dtype=float32) unsupported: logits rounded to %s", x.dtype)
    return F.linear(x, weight).float()


def _mm_float32_into(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> Optional[torch.Tensor]:
    """x @ weight.T in float32 written into `out`; None where torch cannot (the caller copies instead)."""
    global _MM_INTO
    if _MM_OUT_DTYPE and _MM_INTO:
        try:
            return torch.mm(x, weight.t(), out_dtype=torch.float32, out=out)
        except (RuntimeError, TypeError, NotImplementedError):
            _MM_INTO = False  # decided in the graph runner's warm-up passes, before any capture
    return None


def choose_small_batch_matmuls(layers: Sequence[SmallBatchMatmul], settings: KernelSettings) -> dict[str, int]:
    """Per distinct (shape, dtype, bias) among `layers`, time cuBLAS against the GEMV (kernels/gemv.py)
    and set each layer's gemv_max_m; for bf16 / fp16 weights also cuBLAS against cuBLASLt at decode-sized
    batches (kernels/blas_choice.py: each layer's lt_rows). Returns {shape: gemv_max_m}, also logged with the timings."""
    from radixflow.kernels.gemv import choose_gemv

    groups: dict[tuple, list[SmallBatchMatmul]] = {}
    for layer in layers:
        bias = getattr(layer, "bias", None)
        groups.setdefault((*layer.weight.shape, layer.weight.dtype, bias is not None), []).append(layer)
    chosen = {}
    for (n, k, dtype, has_bias), group in groups.items():
        scaled = dtype == torch.float8_e4m3fn  # (weight, bias, scale): the FP8 GEMM against the FP8 GEMV
        max_m, config, timings = choose_gemv([(g.weight, getattr(g, "bias", None), *([g.weight_scale] if scaled else []))
                                              for g in group], settings=settings)
        lt_rows, lt_times = (NO_LT, {}) if scaled else choose_lt_rows([(g.weight, getattr(g, "bias", None)) for g in group])
        for g in group:
            g.gemv_max_m, g.gemv_config, g.lt_rows = max_m, config, lt_rows
        name = f"{n}x{k} {str(dtype).removeprefix('torch.')}{' +bias' if has_bias else ''} x{len(group)}"
        chosen[name] = max_m
        times = ", ".join(f"M={m} cublas {b:.1f} triton {t:.1f}" for m, (b, t) in timings.items())
        log.info("matmul %s: %s us -> %s", name, times, f"Triton GEMV {config} for M <= {max_m}" if max_m else "cuBLAS")
        if lt_times:
            lt_ms = [m for m, use in zip(lt_rows.bounds, lt_rows.lt) if use]
            log.info("matmul %s: %s us -> cuBLASLt at the rows up to M in %s", name,
                     ", ".join(f"M={m} cublas {b:.1f} lt {t:.1f}" for m, (b, t) in lt_times.items()), lt_ms or "none")
    return chosen


class ColumnParallelLinear(SmallBatchMatmul, nn.Linear):
    """Output rows split across ranks, one `Part` per fused block."""

    def __init__(self, in_features: int, parts: Sequence[Part], bias: bool):
        super().__init__(in_features, sum(p.size for p in parts), bias=bias)
        self.parts = list(parts)
        full_out = sum(p.total for p in parts)
        _attach_loaders(self.weight, self.load_shard, self._load_full, (full_out, in_features))
        if bias:
            _attach_loaders(self.bias, self.load_shard, self._load_full, (full_out,))

    def load_shard(self, param: torch.Tensor, tensor: torch.Tensor, key: Hashable = None) -> None:
        offset = 0
        for p in self.parts:
            if key is None or p.key == key:
                with torch.no_grad():
                    param.narrow(0, offset, p.size).copy_(tensor.narrow(0, p.start, p.size))
                return
            offset += p.size
        raise KeyError(f"no part {key!r} in {[p.key for p in self.parts]}")

    def _load_full(self, param: torch.Tensor, full: torch.Tensor) -> None:
        blocks = full.split([p.total for p in self.parts], dim=0)
        for p, block in zip(self.parts, blocks):
            self.load_shard(param, block, p.key)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)


def qkv_parallel_linear(hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool) -> ColumnParallelLinear:
    tp = get_tp()
    s = split_heads(num_heads, num_kv_heads, tp.size, tp.rank)
    q = Part("q", num_heads * head_dim, s.q_start * head_dim, s.q_heads * head_dim)
    kv = dict(total=num_kv_heads * head_dim, start=s.kv_start * head_dim, size=s.kv_heads * head_dim)
    layer = ColumnParallelLinear(hidden, [q, Part("k", **kv), Part("v", **kv)], bias)
    layer.heads = s
    return layer


def merged_column_parallel_linear(in_features: int, sizes: Sequence[int], bias: bool) -> ColumnParallelLinear:
    tp = get_tp()
    parts = [Part(i, n, *split_range(n, tp.size, tp.rank)) for i, n in enumerate(sizes)]
    return ColumnParallelLinear(in_features, parts, bias)


class RowParallelLinear(SmallBatchMatmul, nn.Linear):
    """Input columns `[start, start + size)` of the full layer on this rank; outputs summed."""

    def __init__(self, full_in: int, out_features: int, start: int, size: int, bias: bool):
        super().__init__(size, out_features, bias=bias)
        self.start, self.size, self.tp = start, size, get_tp()
        _attach_loaders(self.weight, self._load_weight, self._load_weight, (out_features, full_in))
        if bias:
            _attach_loaders(self.bias, self._load_bias, self._load_bias, (out_features,))

    def _load_weight(self, param: torch.Tensor, tensor: torch.Tensor, key: Hashable = None) -> None:
        with torch.no_grad():
            param.copy_(tensor.narrow(1, self.start, self.size))

    def _load_bias(self, param: torch.Tensor, tensor: torch.Tensor, key: Hashable = None) -> None:
        with torch.no_grad():
            param.copy_(tensor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return self.matmul(x, self.bias)
        out = all_reduce(self.matmul(x), self.tp)
        return out if self.bias is None else out + self.bias


def row_parallel_linear(full_in: int, out_features: int, bias: bool, start: Optional[int] = None, size: Optional[int] = None):
    """Split `full_in` evenly unless the slice is given (o_proj follows the head split)."""
    if start is None:
        tp = get_tp()
        start, size = split_range(full_in, tp.size, tp.rank)
    return RowParallelLinear(full_in, out_features, start, size, bias)


class VocabParallelEmbedding(nn.Embedding):
    """Rows `[start, start + per_rank)` of the vocabulary; rows past the vocabulary are zero."""

    batch_invariant = False  # as the head: logits through kernels/matmul.py (CUDA)

    def __init__(self, vocab_size: int, dim: int):
        tp = get_tp()
        per = -(-vocab_size // tp.size)
        super().__init__(per, dim)
        self.vocab_size, self.tp = vocab_size, tp
        self.start = tp.rank * per
        self.valid = max(0, min(per, vocab_size - self.start))
        _attach_loaders(self.weight, self.load_shard, self.load_shard, (vocab_size, dim))

    def load_shard(self, param: torch.Tensor, tensor: torch.Tensor, key: Hashable = None) -> None:
        with torch.no_grad():
            param[self.valid :].zero_()
            param[: self.valid].copy_(tensor.narrow(0, self.start, self.valid))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return super().forward(ids)
        local = ids - self.start
        outside = (local < 0) | (local >= self.valid)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return all_reduce(out.masked_fill_(outside.unsqueeze(-1), 0), self.tp)

    def logits(self, hidden: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """This layer as the output head: [N, hidden] -> [N, vocab] float32 on every rank, written into
        `out` ([N, vocab] float32) when given: the decode graphs share one such buffer.

        Half-precision inputs still give float32 logits (accumulated in float32 and not
        rounded): bf16 logits are ~0.125 apart near 20, so greedy decoding would meet exact
        ties that any last-bit difference upstream breaks either way."""
        half = hidden.is_cuda and hidden.dtype in (torch.bfloat16, torch.float16)
        if out is not None and half and self.tp.size == 1 and not self.batch_invariant:
            written = _mm_float32_into(hidden, self.weight, out)
            if written is not None:
                return written
        if self.batch_invariant and hidden.is_cuda:
            from radixflow.kernels.matmul import matmul_batch_invariant

            logits = self.gather_logits(matmul_batch_invariant(hidden, self.weight, out_dtype=torch.float32))
        elif half:
            logits = self.gather_logits(_mm_float32(hidden, self.weight))
        else:
            logits = self.gather_logits(cpu_linear.linear(hidden, self.weight).float())
        return logits if out is None else out.copy_(logits)

    def gather_logits(self, local_logits: torch.Tensor) -> torch.Tensor:
        """[N, vocab/tp] on each rank (this layer as the output head) -> [N, vocab] on every rank."""
        if self.tp.size == 1:
            return local_logits
        return all_gather_last_dim(local_logits, self.tp)[..., : self.vocab_size]


class ParallelLMHead(VocabParallelEmbedding):
    """The untied output projection, split like the embedding."""
