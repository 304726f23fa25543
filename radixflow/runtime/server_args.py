"""All configuration in one dataclass; the CLI is generated from its fields."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from radixflow.constrained.options import PROMOTE_AFTER
from radixflow.errors import RadixflowError
from radixflow.runtime.reasoning import NAMES as REASONING_PARSERS
from radixflow.runtime.server_args_checks import check_args
from radixflow.runtime.sglang_flags import ALIASES as SGLANG_ALIASES, HELP as SGLANG_HELP, cli_choices, sglang_values
from radixflow.runtime.extend_graph_args import (
    DEFAULT_EXTEND_GRAPH_REQS, DEFAULT_EXTEND_GRAPH_TOKENS, extend_graph_tokens,
)  # fmt: skip

if TYPE_CHECKING:
    from radixflow.kernels.settings import KernelSettings

# Defined here, not in the scheduling modules that use them (kv_reserve, overlap): those import torch, and
# `import radixflow` (server_args with it) must not, so `radixflow serve --help` and the detokenizer stay light.
ADMISSION_RULES = ("peak", "ratio")
MAX_FED_TOKENS = 16  # overlap scheduling: the most pending tokens a row may carry into a pass
# in-batch prefix sharing (admission.fresh_enough): on a GPU a few dozen more tokens cost a pass almost nothing, so
# only a longer shared prefix is worth a pass of waiting (SGLang's 32); on a CPU a pass costs about its token count
IN_BATCH_PREFIX_THRESHOLD = {"cuda": 32, "cpu": 4}

_CHOICES = {
    "dtype": ("auto", "float32", "bfloat16", "float16"),
    "schedule_policy": ("lpm", "fcfs"),
    "admission_rule": ADMISSION_RULES,
    "attention_backend": ("auto", "torch_native", "triton", "flashinfer"),
    "load_format": ("auto", "dummy"),
    "device": ("auto", "cpu", "cuda"),
    "overlap_schedule": ("auto", "on", "off"),
    "kv_cache_dtype": ("auto", "fp8_e4m3"),
    "router_policy": ("cache_aware", "round_robin", "power_of_two", "random"),
    "grammar_backend": ("llguidance", "outlines", "auto", "none"),
    "tool_call_parser": ("auto", "hermes", "qwen", "qwen25", "llama3", "mistral", "generic"),  # server/tool_formats.py
    "reasoning_parser": REASONING_PARSERS,  # runtime/reasoning.py; None (the default): no parsing
    "attention_p_parts": (1, 2),
    "tp_scheduler": ("replicated", "leader"),
    "native_attention_dtype": ("float32", "float64"),
    "sampling_defaults": ("model", "openai"),
}

_HELP = {
    "model_path": "HF model directory or .gguf file; empty = the embedded SmolLM2-135M-Instruct",
    "max_total_tokens": "KV pool size in tokens (default: sized from free memory)",
    "mem_fraction_static": "CUDA: the KV pool takes the free memory less (1 - this) of the device's total, which is "
    "left for activations, sampling and logprob buffers (the start-up log shows the split; see docs/gpu.md)",
    "chunked_prefill_size": "split prompts longer than this into chunks; -1 disables",
    "page_size": "KV slots per page; the radix cache matches whole pages",
    "disable_radix_cache": "no prefix reuse (for ablations)",
    "schedule_policy": "lpm = longest cached prefix first; fcfs = arrival order",
    "in_batch_prefix_threshold": "a waiting request that shares more than this many uncached prompt tokens with one "
    "admitted to the same pass waits a pass and reuses its KV instead of computing them again (default: 32 on CUDA, "
    "4 on CPU, where a pass costs about as much as the tokens it computes)",
    "admission_rule": "how admission keeps room for what running requests will still decode. peak (the default): a "
    "request is admitted only if the pool's need at its highest, as requests grow and end, fits; budgets of requests "
    "that may stop early (EOS, stops) count what finished and running requests' lengths say they will use, "
    "ignore_eos ones count in full: few or no retractions. ratio: SGLang's rule, remaining budgets times a ratio decaying from 0.7 to "
    "0.1 (fuller batches early, retractions when requests run long); see docs/architecture.md",
    "max_running_requests": "most requests decoding at once (default: 1024 on CUDA, 256 on CPU)",
    "cuda_graph_max_bs": "largest decode batch replayed from a CUDA graph; larger ones launch eagerly "
    "(default: max_running_requests)",
    "cuda_graph_extend_max_tokens": "also replay extend (prefill) passes of up to this many new tokens from CUDA "
    f"graphs, padded to token buckets (0 = off: eager extend passes; capped at the prefill chunk). Default: "
    f"{DEFAULT_EXTEND_GRAPH_TOKENS} on CUDA where the graphs can run (triton attention, tp_size 1, no deterministic "
    "inference, no FP8 weights or KV cache, no --disable-cuda-graph), else off; also off (a warning) when they do "
    "not fit beside the KV pool and --mem-fraction-static's headroom. Set on the CPU, the padded passes run without "
    "graphs (a correctness check). See docs/gpu.md",
    "cuda_graph_extend_max_reqs": "most requests in an extend pass replayed from a CUDA graph "
    f"(default {DEFAULT_EXTEND_GRAPH_REQS}); passes with more run eagerly",
    "disable_cuda_graph_extend": "run every extend (prefill) pass eagerly: no extend CUDA graphs (same as "
    "--cuda-graph-extend-max-tokens 0)",
    "disable_gc_freeze": "do not gc.freeze() what start-up made (nor Engine.freeze_gc() what warm-up made): full "
    "garbage collections then walk the model's objects too; for applications that freeze for their own reasons",
    "overlap_schedule": "launch the next pass (decode, or extend) before reading back the last one's tokens; auto = on CUDA",
    "disable_overlap_schedule": "same as --overlap-schedule off (SGLang's flag)",
    "constrained_json_whitespace_pattern": "regex of the whitespace allowed between JSON tokens in json_schema "
    "outputs, e.g. '[ ]?' or '[\\n\\t ]*'; default: none (compact JSON)",
    "enable_deterministic_inference": "batch-invariant kernels: a request's outputs and logprobs are the same bits "
    "whatever it is batched with (CUDA, tp_size 1, triton or torch_native attention; slower)",
    "quantization": "fp8: quantize a bf16 checkpoint's linear layers to FP8 e4m3 at load (per-channel weight scales, "
    "per-token activation scales); pre-quantized FP8 checkpoints (quant_method fp8 or compressed-tensors) "
    "are detected from their config.json without it",
    "kv_cache_dtype": "auto = the model's dtype; fp8_e4m3 stores K and V in FP8 with a scale per layer and KV head "
    "(twice the tokens in the same memory)",
    "dp_size": "serve N replicas of the engine behind sglang-router at --host/--port (one per GPU group of "
    "tp_size GPUs, or N CPU processes); a replica that dies is restarted",
    "router_policy": "how the router (--dp-size > 1) picks a replica: cache_aware sends a prompt where its "
    "prefix was sent before",
    "router_args": "more sglang-router flags for --dp-size > 1, as one string, e.g. '--cache-threshold 0.5'",
    "grammar_backend": "what compiles regex / json_schema grammars: llguidance (millisecond compiles, the most "
    "JSON-schema keywords) or outlines (outlines-core: exact shortest outputs, slower compiles); ebnf always runs on "
    "llguidance. auto (the default) starts each grammar on llguidance and, on a single-GPU server, moves a "
    f"regex / JSON schema with {PROMOTE_AFTER} requests to outlines once a background compile of it (in a child "
    "process) is done (faster steps at large batches; its running requests switch too). Such a grammar is compiled on llguidance from outlines' regex, "
    "so its language (outlines' reading of the schema) stays at the move; costs: slower llguidance masks before the "
    f"move (9-15x per mask on the CPU), paid for good by a grammar with fewer than {PROMOTE_AFTER} requests (many "
    "distinct schemas: unmeasured on a GPU; use llguidance for such workloads if it matters), a short pause per move, "
    "memory per moved grammar; a CPU or tensor-parallel server reads schemas the llguidance way, a single-GPU server "
    "the outlines way (docs/grammars.md); none: requests with a grammar are refused (400), as SGLang's none",
    "disable_jump_forward": "never append the tokens a grammar forces without sampling them (with jumps on, under "
    f"overlap scheduling a jump is cut to what keeps its row within {MAX_FED_TOKENS} fed tokens; the rest is jumped "
    "over on later steps)",
    "jump_forward_max_batch": "with overlap scheduling, llguidance rows jump forward after a sampled token only in "
    "decode batches of at most this many rows (default 16; 0: only a request's first jump, before its prefill); "
    "forced tokens are then fed one a pass, so such a jump saves no pass while its host work slows every step of a "
    "large batch. Outlines rows jump in any batch, above this one only by appending (a re-tokenized sampled token "
    "would waste the pass launched on it); a request's first jump and every jump without overlap are always taken",
    "grammar_threads": "threads llguidance fills a step's grammar masks and consumes its sampled tokens on, "
    "for all constrained rows at once (0 = llguidance's default: 80%% of the CPUs, up to 32; above 256 is refused). A "
    "grammar used by several requests also gets up to this many separately built matchers (never more than the "
    "CPUs), one more per extra request, built in the background: requests of one grammar then do not wait on "
    "one lexer's lock (docs/constrained.md)",
    "grammar_compile_timeout_s": "a grammar whose compile runs longer (from when a worker starts it, not counting "
    "time queued behind other compiles) fails its request with a 400; under --grammar-backend auto, a background "
    "outlines compile running longer is stopped (its child process killed) and the grammar stays on llguidance",
    "tool_call_parser": "tool-call format of /v1/chat/completions tools: auto = from the chat template "
    "(<tool_call> -> hermes, [TOOL_CALLS] -> mistral, <|python_tag|> -> llama3, no tool support -> generic); "
    "qwen and qwen25 (SGLang's name) are hermes' format",
    "reasoning_parser": "split a reasoning model's thinking from its answer in /v1/chat/completions: the message's "
    "reasoning_content and content (streamed as delta.reasoning_content); requests may turn it off with "
    "separate_reasoning: false (docs/serving.md, Reasoning models)",
    "disable_pdl": "launch the decode kernels without programmatic dependent launch (Hopper and newer GPUs)",
    "pdl_late_trigger": "under PDL, let the next kernel be scheduled only after a kernel's wait (default: before it)",
    "attention_p_parts": "Triton attention multiplies the softmax weights p as this many 16-bit parts: 2 keeps "
    "bf16 attention close to float32, 1 rounds p once",
    "disable_flash_prefill": "triton attention backend: run prompt-only rows of a prefill through the Triton extend "
    "kernel too, instead of torch's variable-length flash kernel (used where the GPU and torch have it)",
    "disable_fused_kernels": "run RMSNorm, rotary and SiLU-and-mul in torch even with the triton attention backend",
    "disable_gemv_epilogue": "keep the RMSNorm weights in the norms and run the norm and SiLU-and-mul kernels at "
    "decode batches on the GEMV path, instead of folding the weights into the next linear at load and doing the "
    "norm's scaling, the residual add and SiLU-and-mul in the GEMVs' epilogues (docs/gpu.md; that applies on CUDA "
    "with the triton attention backend's kernels at tp 1, not to pre-quantized FP8 checkpoints)",
    "fused_rotary_max_batch": "decode batches up to this size rotate q/k and store K/V inside the Triton attention "
    "kernel (one launch a layer fewer); 0 = a separate kernel always",
    "bf16_residual": "keep the residual stream in the model's dtype instead of float32 (less exact)",
    "disable_triton_sampling": "draw sampled tokens with torch's sort-based path instead of the Triton kernel",
    "fp8_weight_only": "FP8 weights: dequantize them for the GEMM instead of quantizing activations per token "
    "(slow; separates the two errors)",
    "disable_fp8_fast_accum": "FP8 GEMMs: promote partial sums to float32 instead of Hopper's fast FP8 "
    "accumulation (slower; the error fast accumulation adds to a product is under a tenth of e4m3's own)",
    "native_attention_dtype": "what the torch_native attention backend computes in (float64: exact attention, "
    "a yardstick)",
    "tp_scheduler": "tensor parallelism: replicated = every rank runs the same scheduler on the same inputs (rank 0 "
    "shares only the arrivals and its sampled ids); leader = rank 0 schedules alone and broadcasts each forward pass",
    "enable_one_shot_allreduce": "tensor parallelism on CUDA: small all-reduces (decode batches) through PyTorch's "
    "symmetric-memory one-shot all-reduce, inside the CUDA graphs, instead of NCCL",
    "constrained_json_any_depth": "how deep free-form JSON ({\"type\": \"object\"}, json_object) may nest "
    "objects/arrays, 0-3; each level multiplies its compile time (2: ~1 s, 3: ~12 s)",
    **SGLANG_HELP,
}


@dataclass
class ServerArgs:
    model_path: Optional[str] = None
    tokenizer_path: Optional[str] = None
    dtype: str = "auto"
    device: str = "auto"
    load_format: str = "auto"
    context_length: Optional[int] = None
    random_seed: int = 0

    # memory and scheduling
    max_total_tokens: Optional[int] = None
    mem_fraction_static: float = 0.85
    max_running_requests: Optional[int] = None
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int = 4096
    page_size: int = 1
    schedule_policy: str = "lpm"
    in_batch_prefix_threshold: Optional[int] = None
    admission_rule: str = "peak"
    disable_radix_cache: bool = False
    overlap_schedule: str = "auto"
    disable_overlap_schedule: bool = False
    enable_mixed_chunk: bool = False  # SGLang's: runtime/scheduling/mixed_pass.py
    disable_gc_freeze: bool = False

    # kernels
    attention_backend: str = "auto"
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: Optional[int] = None
    cuda_graph_extend_max_tokens: Optional[int] = None  # None: DEFAULT_EXTEND_GRAPH_TOKENS where they can run
    cuda_graph_extend_max_reqs: int = DEFAULT_EXTEND_GRAPH_REQS
    disable_cuda_graph_extend: bool = False
    enable_deterministic_inference: bool = False
    quantization: Optional[str] = None
    kv_cache_dtype: str = "auto"
    # kernel and precision choices (KernelSettings; the defaults are the fast and exact ones)
    disable_pdl: bool = False
    pdl_late_trigger: bool = False
    attention_p_parts: int = 2
    disable_flash_prefill: bool = False
    disable_fused_kernels: bool = False
    disable_gemv_epilogue: bool = False
    fused_rotary_max_batch: int = 8
    bf16_residual: bool = False
    disable_triton_sampling: bool = False
    fp8_weight_only: bool = False
    disable_fp8_fast_accum: bool = False
    native_attention_dtype: str = "float32"

    # constrained decoding
    grammar_backend: str = "auto"
    disable_jump_forward: bool = False
    jump_forward_max_batch: int = 16
    grammar_compile_workers: int = 2
    grammar_threads: int = 0
    grammar_compile_timeout_s: float = 10.0
    constrained_json_whitespace_pattern: Optional[str] = None
    constrained_json_any_depth: int = 2
    tool_call_parser: str = "auto"
    reasoning_parser: Optional[str] = None

    # serving
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: Optional[str] = None
    served_model_name: Optional[str] = None
    log_level: str = "info"
    max_new_tokens_limit: int = 32768
    max_batch_size: int = 1024
    max_body_bytes: int = 32 * 1024 * 1024
    stream_interval: int = 1
    log_interval_s: float = 10.0
    chat_template: Optional[str] = None  # SGLang's serving flags: runtime/sglang_flags.py
    stream_response_default_include_usage: bool = False
    sampling_defaults: str = "model"
    log_requests: bool = False
    log_requests_level: int = 2

    # parallelism
    tp_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: Optional[str] = None
    tp_scheduler: str = "replicated"
    enable_one_shot_allreduce: bool = False

    # data parallelism: replicas behind sglang-router (runtime/server/data_parallel.py)
    dp_size: int = 1
    router_policy: str = "cache_aware"
    router_args: Optional[str] = None

    def __post_init__(self) -> None:
        sglang_values(self)
        check_args(self, _CHOICES)

    def extend_graph_tokens(self, device: str, fp8: bool = False) -> int:
        """The extend graphs' largest token bucket on `device`, 0: eager (extend_graph_args.py)."""
        return extend_graph_tokens(self, device, fp8)

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def resolve_max_running(self, device: str) -> int:
        if self.max_running_requests is None:
            self.max_running_requests = 1024 if str(device).startswith("cuda") else 256
        return self.max_running_requests

    def graph_max_bs(self, device: str) -> int:
        """Largest decode batch with a CUDA graph: cuda_graph_max_bs, by default every batch the
        scheduler can run. Under tensor parallelism an eager pass is host-bound (two all-reduce
        launches a layer), so every batch size the scheduler may run gets a graph."""
        running = self.resolve_max_running(device)
        return running if self.cuda_graph_max_bs is None else min(self.cuda_graph_max_bs, running)

    def resolve_in_batch_threshold(self, device: str) -> int:
        if self.in_batch_prefix_threshold is not None:
            return self.in_batch_prefix_threshold
        return IN_BATCH_PREFIX_THRESHOLD["cuda" if str(device).startswith("cuda") else "cpu"]

    def overlap_enabled(self, device: str) -> bool:
        if self.disable_overlap_schedule or self.overlap_schedule == "off":
            return False
        return self.overlap_schedule == "on" or str(device).startswith("cuda")

    def resolved_dtype(self) -> str:
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if self.resolved_device() == "cuda" else "float32"

    def kernel_settings(self) -> "KernelSettings":
        """The kernel and precision choices these arguments make, for the model runner to pass down."""
        from radixflow.kernels.settings import KernelSettings

        det = self.enable_deterministic_inference
        return KernelSettings(
            pdl=not self.disable_pdl,
            pdl_early_trigger=not self.pdl_late_trigger,
            attention_p_parts=self.attention_p_parts,
            # deterministic: one kernel for every extend row, whether or not a prefix was cached
            flash_prefill=not (det or self.disable_flash_prefill),
            fused_kernels=not self.disable_fused_kernels,
            gemv_epilogue=not self.disable_gemv_epilogue,
            # deterministic: the separate rotary kernel at every batch size, one rounding of q and k for all
            fused_rotary_max_batch=0 if det else self.fused_rotary_max_batch,
            fp32_residual=not self.bf16_residual,
            triton_sampling=not self.disable_triton_sampling,
            fp8_activations=not self.fp8_weight_only,
            fp8_fast_accum=not self.disable_fp8_fast_accum,
            batch_invariant=det,
            native_attention_dtype=self.native_attention_dtype,
        )

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "ServerArgs":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise RadixflowError(f"unknown server argument(s): {', '.join(unknown)}")
        return cls(**kwargs)

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        for f in dataclasses.fields(cls):
            if f.metadata.get("cli") is False:
                continue
            flags = ("--" + f.name.replace("_", "-"), *SGLANG_ALIASES.get(f.name, ()))
            if f.type in ("bool", bool):
                parser.add_argument(*flags, action="store_true", help=_HELP.get(f.name))
                continue
            kind = {"int": int, "float": float}.get(str(f.type), str)
            if str(f.type) == "Optional[int]":
                kind = int
            parser.add_argument(*flags, type=kind, default=f.default, choices=cli_choices(f.name, _CHOICES.get(f.name)),
                                help=_HELP.get(f.name))

    def to_cli(self, **overrides: Any) -> list[str]:
        """The `radixflow serve` flags that reproduce these arguments (with `overrides`), for the
        processes a supervisor starts."""
        argv: list[str] = []
        for f in dataclasses.fields(self):
            value = overrides.get(f.name, getattr(self, f.name))
            if f.metadata.get("cli") is False or value is None or value == f.default:
                continue
            flag = "--" + f.name.replace("_", "-")
            argv += [flag] if value is True else [flag, str(value)]
        return argv

    @classmethod
    def from_cli(cls, namespace: argparse.Namespace) -> "ServerArgs":
        names = {f.name for f in dataclasses.fields(cls) if f.metadata.get("cli") is not False}
        return cls(**{k: v for k, v in vars(namespace).items() if k in names})
