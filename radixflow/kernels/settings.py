"""Kernel and precision choices of one engine, fixed when it is built.

`ServerArgs.kernel_settings()` derives them from the server arguments; the model runner passes
them to the model's layers, the attention backend and the sampler, and changing them
(`ModelRunner.set_kernel_settings`) rebuilds what captured the old ones, CUDA graphs included.
Kernel functions take them as an argument (default: `DEFAULT_KERNEL_SETTINGS`); nothing reads
them from a global.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelSettings:
    # Programmatic dependent launch for the decode-path kernels on Hopper and newer (kernels/pdl.py),
    # and whether a kernel lets the next one be scheduled before its own wait (early) or after it.
    pdl: bool = True
    pdl_early_trigger: bool = True
    # 16-bit parts the Triton attention kernels multiply the softmax weights p in: 2 keeps bf16
    # attention close to float32, 1 rounds p once (kernels/attention_common.py).
    attention_p_parts: int = 2
    # Prompt-only rows of an extend pass through torch's variable-length flash kernel where the device
    # has it (kernels/flash_varlen.py); False: the Triton extend kernel for every row.
    flash_prefill: bool = True
    # Under flash_prefill, passes of fresh prompts that all have one length through torch's cuDNN attention on
    # Hopper (kernels/cudnn_dense.py); False: the flash kernel for them too.
    cudnn_prefill: bool = True
    # RMSNorm, rotary and SiLU-and-mul as Triton kernels when the attention backend is Triton's.
    fused_kernels: bool = True
    # The RMSNorm weights folded into the next linear at load, and at decode batches on the GEMV path the
    # norm's scaling, the residual add and SiLU-and-mul in the GEMVs' epilogues (layers/norm_fold.py says
    # where it applies). The fold happens at load: False after load runs the folded model through the norm
    # kernels (weight ones); True after a load that did not fold does nothing.
    gemv_epilogue: bool = True
    # Decode batches up to this size rotate q/k and store K/V inside the attention kernel (0: never).
    fused_rotary_max_batch: int = 8
    # The residual stream in float32 (False: in the model's dtype).
    fp32_residual: bool = True
    # Sampled rows drawn by the Triton kernel on CUDA (False: torch's sort-based path).
    triton_sampling: bool = True
    # FP8 weights: quantize activations per token for the GEMM (False: dequantize the weight instead,
    # which separates the two errors; slow).
    fp8_activations: bool = True
    # FP8 GEMMs: the RMSNorm and SiLU-and-mul before them write the quantized rows and their scales
    # themselves (kernels/norm_act.py), the same bits as quantizing their bf16 output in a kernel of its own.
    fp8_fused_quantize: bool = True
    # FP8 GEMMs (torch._scaled_mm) use Hopper's fast FP8 accumulation, as vLLM's and SGLang's CUTLASS FP8 kernels
    # do (False: partial sums promoted to float32). On an H100 it adds 0.13-0.29% relative error to the product at
    # Llama-3-8B's linear shapes (random operands), beside e4m3's own 3.7%, and made the offline workload 1.05x
    # faster (BENCHMARKS.md).
    fp8_fast_accum: bool = True
    # Deterministic inference: a request's results do not depend on what it is batched with.
    batch_invariant: bool = False
    # What the torch-native attention backend computes in ("float64": an exactness yardstick).
    native_attention_dtype: str = "float32"

    def __post_init__(self) -> None:
        assert self.attention_p_parts in (1, 2), self.attention_p_parts
        assert self.fused_rotary_max_batch >= 0, self.fused_rotary_max_batch
        assert self.native_attention_dtype in ("float32", "float64"), self.native_attention_dtype


DEFAULT_KERNEL_SETTINGS = KernelSettings()
