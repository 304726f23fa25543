"""Loads the model onto its device, sizes the KV pool and runs forward passes."""

from __future__ import annotations

import gc
import logging
from typing import Callable, Optional

import torch

from radixflow.errors import ModelPathError, RadixflowError
from radixflow.kernels.settings import KernelSettings
from radixflow.radix_cache.memory_pool import KVPool
from radixflow.runtime.execution.attention import attention_backend_class, create_attention_backend
from radixflow.runtime.distributed.tp_group import TPContext, building_with, get_tp, min_over_ranks
from radixflow.runtime.execution.forward_batch import ForwardBatch
from radixflow.runtime.execution.layers.fp8_linear import read_checkpoint_quantization
from radixflow.runtime.execution.layers.norm_fold import fold_off_reason
from radixflow.runtime.execution.layers.rotary import rope_params
from radixflow.model_files import load_config, resolve_model
from radixflow.runtime.execution.model_loader import init_dummy_weights, iter_safetensors
from radixflow.runtime.execution.models.llama import SUPPORTED_ARCHITECTURES, LlamaForCausalLM
from radixflow.runtime.extend_graph_args import extend_graph_off
from radixflow.runtime.server_args import ServerArgs
from radixflow.runtime.distributed.tp_worker import broadcast_step, make_req_to_token

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_CPU_KV_BUDGET_BYTES = 2 << 30
_MIN_KV_SLOTS = 1024


class ModelRunner:
    def __init__(self, args: ServerArgs):
        self.args = args
        self.device = args.resolved_device()
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise RadixflowError(f"device={self.device}, but torch {torch.__version__} sees no CUDA device here; use "
                                 "--device cpu or auto")
        self.dtype = _DTYPES[args.resolved_dtype()]
        self.settings = args.kernel_settings()  # set_kernel_settings changes them
        args.resolve_max_running(self.device)  # the scheduler reads it after this
        self.tp = get_tp() if args.tp_size > 1 else TPContext()  # joined by tp_launch.start_tp
        if args.load_format == "dummy" and args.model_path and args.model_path.endswith(".json"):
            self.model_dir = None
            self.config = _config_from_json(args.model_path)
            if not args.tokenizer_path:  # random weights: any tokenizer covering the ids will do
                args.tokenizer_path = resolve_model(None).path
        else:
            files = resolve_model(args.model_path, need_weights=args.load_format != "dummy")
            self.model_dir = files.path
            self.config = load_config(files.path)
        self._check_arch()
        # the checkpoint's own FP8 weights: read before the KV pool is sized, which the extend graphs' default needs
        self.ckpt_fp8 = read_checkpoint_quantization(self.config) if self.model_dir else None
        if args.enable_deterministic_inference and self.device != "cuda":
            raise RadixflowError("enable_deterministic_inference needs a CUDA device (its batch-invariant matmul is Triton)")
        self.context_len = _context_len(args.context_length, self.config)
        self.model = self._load_model()
        self.memory_plan: dict[str, int] = {}  # how the KV pool was sized on CUDA (_kv_slots), in bytes
        self.vocab_size = self.model.shape.vocab_size
        self._init_memory()
        self.model.set_kernel_settings(self.settings, self._fused())
        if self.device == "cuda" and self._fused() and not self.settings.batch_invariant:
            self.model.choose_small_batch_matmuls(self.settings)  # before graph capture: the graphs bake in the choice
        if args.enable_one_shot_allreduce:  # before graph capture: the graphs bake in the all-reduce path
            self._init_one_shot_allreduce()
        self.graph_runner = self._init_cuda_graphs()
        self.extend_graphs = self._init_extend_graphs()

    def _init_one_shot_allreduce(self) -> None:
        from radixflow.runtime.distributed.one_shot_allreduce import make_one_shot

        rows = max(self.args.graph_max_bs(self.device), 1)
        self.tp.one_shot = make_one_shot(self.tp.device_group, rows * self.model.shape.hidden * self.dtype.itemsize)
        log.info("one-shot all-reduce: up to %d rows through symmetric memory", rows)

    def _fused(self) -> bool:
        """Whether the model's norm / rotary / SiLU-and-mul run as Triton kernels."""
        return getattr(self.backend, "fused_kernels", False) and self.settings.fused_kernels

    def _check_arch(self) -> None:
        archs = getattr(self.config, "architectures", None) or ["LlamaForCausalLM"]
        if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
            raise ModelPathError(
                f"architecture {archs} is not supported; radixflow runs {', '.join(SUPPORTED_ARCHITECTURES)}"
            )

    def _load_model(self) -> LlamaForCausalLM:
        torch.manual_seed(self.args.random_seed)
        with torch.device(self.device):
            prev = torch.get_default_dtype()
            torch.set_default_dtype(self.dtype)
            try:
                with building_with(self.tp):
                    model = LlamaForCausalLM(self.config, self.context_len)
            finally:
                torch.set_default_dtype(prev)
        model.rotary.float()  # cos/sin tables stay float32
        if self.ckpt_fp8 is not None:
            n = model.prepare_fp8(self.ckpt_fp8)
            log.info("FP8 checkpoint (%s): %d linear layers in FP8", self.ckpt_fp8.method, n)
        if self.args.load_format == "dummy":
            init_dummy_weights(model, self.args.random_seed)
        else:
            model.load_weights(iter_safetensors(self.model_dir))
        self._fold_norms(model)  # before quantizing: W * g rounded once
        if self.args.quantization == "fp8" and self.ckpt_fp8 is None:
            log.info("--quantization fp8: %d linear layers quantized to FP8 e4m3", model.quantize_fp8())
        if self.device == "cuda":  # the fold's and the quantization's float32 temporaries (~1 GB on Llama-3-8B):
            # a replaced parameter sits in a cycle with its own weight_loader (a partial over it): without a
            # collection the bf16 weights that FP8 replaced (13 GiB on Llama-3-8B) outlived the KV pool's sizing
            gc.collect()
            torch.cuda.empty_cache()  # _init_memory sizes the KV pool by mem_get_info, blind to torch's cached blocks
        return model.eval()

    def _fold_norms(self, model: LlamaForCausalLM) -> None:
        backend = attention_backend_class(self.args.attention_backend, self.device)
        biased = any(name.endswith(".bias") for name, _ in model.named_parameters())
        why = fold_off_reason(self.settings, self.device, self.tp.size, backend, prequantized=self.ckpt_fp8 is not None,
                              biased=biased)
        if why:
            log.info("norm weights not folded, no GEMV epilogues: %s", why)
            return
        model.fold_norms()
        log.info("norm weights folded into qkv / gate_up: decode batches on the GEMV path use the GEMV epilogues")

    def _init_memory(self) -> None:
        s = self.model.shape
        q_heads, kv_heads = self.model.local_heads()  # this rank's share under tensor parallelism
        kv_dtype = torch.float8_e4m3fn if self.args.kv_cache_dtype == "fp8_e4m3" else self.dtype
        per_token = KVPool.bytes_per_token(s.num_layers, kv_heads, s.head_dim, kv_dtype)
        self.extend_limits = self._plan_extend_graphs(per_token)
        num_slots = self._kv_slots(per_token)
        ps = self.args.page_size
        num_slots = min_over_ranks(max(num_slots - num_slots % ps, 2 * ps), self.tp)  # same slots on every rank
        self.kv_pool = KVPool(num_slots, ps, s.num_layers, kv_heads, s.head_dim, kv_dtype, self.device)
        if self.kv_pool.fp8:
            self._load_kv_scales()
        rows = self.args.max_running_requests + 1
        leader_broadcasts = self.tp.size > 1 and self.args.tp_scheduler == "leader"
        self.req_to_token = make_req_to_token(rows, self.context_len + 8, self.device, self.tp.rank, leader_broadcasts)
        # called with each pass before it runs: rank 0's broadcast of the pass (--tp-scheduler leader),
        # or the replicated schedulers' agreement check (scheduling/replica.py sets it)
        self.pass_hook: Optional[Callable[[ForwardBatch], None]] = None
        if leader_broadcasts and self.tp.is_leader:
            self.pass_hook = lambda fb: broadcast_step(self.req_to_token, fb, self.tp)
        self.backend = create_attention_backend(
            self.args.attention_backend,
            self.device,
            kv_pool=self.kv_pool,
            req_to_token=self.req_to_token,
            num_q_heads=q_heads,
            num_kv_heads=kv_heads,
            head_dim=s.head_dim,
            deterministic=self.args.enable_deterministic_inference,
            settings=self.settings,
        )
        self.backend.warm_up(self.dtype)
        log.info("KV pool: %d tokens (%.1f MiB)", num_slots, num_slots * per_token / 2**20)

    def _kv_slots(self, per_token: int) -> int:
        if self.args.max_total_tokens:
            return self.args.max_total_tokens
        if self.device == "cuda":
            free, total = torch.cuda.mem_get_info()
            # the extend graphs (captured after the pool) come out of the KV pool's share, not the headroom
            headroom, graphs = self._headroom(total), self._extend_graph_bytes()
            budget = free - headroom - graphs
            self.memory_plan = {"total": total, "free_before_pool": free, "headroom": headroom,
                                "extend_graphs": graphs, "kv_budget": budget,
                                "torch_allocated": torch.cuda.memory_allocated(),
                                "torch_reserved": torch.cuda.memory_reserved()}
            log.info("KV pool budget: %.1f GiB free of %.1f, less %.1f GiB headroom (--mem-fraction-static %.2f) "
                     "and %.1f GiB for extend graphs", free / 2**30, total / 2**30, headroom / 2**30,
                     self.args.mem_fraction_static, graphs / 2**30)
            return max(int(budget // per_token), _MIN_KV_SLOTS)
        return max(min(_CPU_KV_BUDGET_BYTES // per_token, 1 << 17), _MIN_KV_SLOTS)

    def _headroom(self, total: int) -> float:
        """The device memory left out of the KV pool for activations (eager prefill chunks) and the decode graphs."""
        return (1 - self.args.mem_fraction_static) * total

    def _load_kv_scales(self) -> None:
        """The checkpoint's calibrated FP8 KV scales (per layer: a scalar, or one per KV head), else 1.0."""
        scales = getattr(self.model, "kv_cache_scales", {})
        heads = self.model.layers[0].self_attn.qkv_proj.heads  # this rank's KV heads (tensor parallelism)
        for layer, kv in scales.items():
            k, v = (kv.get(n, torch.ones(1)) for n in ("k", "v"))
            k, v = (t.reshape(-1) if t.numel() == 1 else t.reshape(-1)[heads.kv_start : heads.kv_start + heads.kv_heads]
                    for t in (k, v))
            self.kv_pool.set_scales(layer, k, v)
        log.info("FP8 KV cache: %s", f"checkpoint scales for {len(scales)} layers" if scales else "scales 1.0 (none in the checkpoint)")

    def _init_cuda_graphs(self, max_bs: int | None = None):
        if self.device != "cuda" or self.args.disable_cuda_graph or not getattr(self.backend, "supports_cuda_graph", False):
            return None
        from radixflow.runtime.execution.cuda_graph_runner import CudaGraphRunner

        max_bs = self.args.graph_max_bs(self.device) if max_bs is None else max_bs
        return CudaGraphRunner(self.model, self.backend, max_bs) if max_bs > 0 else None

    def _plan_extend_graphs(self, per_token: int) -> Optional[tuple[int, int]]:
        """(most tokens, most requests) of the extend passes padded to buckets, None when they run eagerly.
        Decided once, before the KV pool is sized, so that a default that turns itself off leaves the pool
        its memory. A size that was set and cannot run is an error; the default logs why it is off."""
        explicit = self.args.cuda_graph_extend_max_tokens is not None
        why = extend_graph_off(self.args, self.device, fp8=self.ckpt_fp8 is not None)
        if why:
            if not explicit:
                log.info("extend CUDA graphs off: %s", why)
            return None
        limits = self._extend_graph_limits(explicit)
        if self.device == "cuda" and not explicit and not self._default_fits(limits, per_token):
            return None
        return limits

    def _extend_graph_limits(self, explicit: bool) -> tuple[int, int]:
        max_tokens = self.args.extend_graph_tokens(self.device, fp8=self.ckpt_fp8 is not None)
        cap = self.context_len  # the pad request's row is that wide
        if self.args.chunked_prefill_size > 0:  # no extend pass holds more: larger buckets could never be taken
            cap = min(cap, self.args.chunked_prefill_size, self.args.max_prefill_tokens)
        if explicit and max_tokens > cap:
            log.warning("cuda_graph_extend_max_tokens %d is above the context length or the prefill chunk "
                        "(--chunked-prefill-size, --max-prefill-tokens): extend graphs up to %d tokens",
                        max_tokens, cap)
        return min(max_tokens, cap), min(self.args.cuda_graph_extend_max_reqs, self.args.max_running_requests)

    def _default_fits(self, limits: tuple[int, int], per_token: int) -> bool:
        """Whether the default's graphs fit beside the KV pool (--max-total-tokens, else its smallest size,
        the rest of its share going to the pool) without eating the headroom that eager passes need."""
        free, total = torch.cuda.mem_get_info()
        spare = free - self._headroom(total) - (self.args.max_total_tokens or _MIN_KV_SLOTS) * per_token
        need = self._extend_graph_bytes(limits)
        if need <= spare:
            return True
        log.warning("extend CUDA graphs off: they need up to %.0f MiB, %.0f MiB is free beside the KV pool and the "
                    "headroom for activations (--mem-fraction-static); extend passes run eagerly",
                    need / 2**20, max(spare, 0) / 2**20)
        return False

    def _extend_graph_bytes(self, limits: Optional[tuple[int, int]] = None) -> int:
        """What the extend graphs of `limits` (default: the planned ones) will hold on this device (an upper
        estimate; 0 when off or on the CPU)."""
        from radixflow.runtime.execution.extend_graph_runner import graph_memory_bytes

        limits = limits or self.extend_limits
        if self.device != "cuda" or limits is None:
            return 0
        s = self.model.shape
        return graph_memory_bytes(s.hidden, s.intermediate, s.vocab_size, *limits)

    def _init_extend_graphs(self):
        """Graphs for small extend passes on CUDA (triton attention; on by default where they can run),
        the same padded passes without graphs on the CPU when a size is set (a correctness check)."""
        if self.extend_limits is None:
            return None
        graphs = self.device == "cuda"
        if graphs and not self._extend_graphs_fit(explicit=self.args.cuda_graph_extend_max_tokens is not None):
            self.extend_limits = None  # off for this process: the pool was sized without the estimate already
            return None
        if not graphs:
            log.warning("cuda_graph_extend_max_tokens on %s: small extend passes run padded without graphs "
                        "(a correctness check, slower than unpadded passes)", self.device)
        from radixflow.runtime.execution.extend_graph_runner import ExtendGraphRunner

        return ExtendGraphRunner(self.model, self.backend, *self.extend_limits, self.device, use_graphs=graphs)

    def _extend_graphs_fit(self, explicit: bool = True) -> bool:
        """Whether the extend graphs can be captured now: the plan left them their memory, but the decode
        graphs (or a capture since) may have taken it. A size that was set and cannot is an error, the
        default is turned off with a warning."""
        need, free = self._extend_graph_bytes(), torch.cuda.mem_get_info()[0]
        log.info("extend CUDA graphs: up to %.0f MiB (%.0f MiB free)", need / 2**20, free / 2**20)
        if need <= free:
            return True
        max_tokens, max_reqs = self.extend_limits
        msg = (f"cuda_graph_extend_max_tokens={max_tokens}, cuda_graph_extend_max_reqs={max_reqs}: the extend graphs "
               f"need up to {need / 2**20:.0f} MiB, {free / 2**20:.0f} MiB is free")
        if explicit:
            raise RadixflowError(f"{msg}; lower them, or --max-total-tokens / --mem-fraction-static")
        log.warning("%s: extend passes run eagerly; the KV pool was already sized without that memory, which stays "
                    "unused until a restart (--max-total-tokens / --mem-fraction-static leave more)", msg)
        return False

    def set_kernel_settings(self, settings: KernelSettings, graph_max_bs: int | None = None) -> None:
        """Switch kernel settings: the model's layers and the attention backend take them, and the CUDA
        graphs, which baked in the old ones, are captured again (up to `graph_max_bs` rows; default:
        the server arguments' size). Deterministic inference is fixed when the model loads."""
        assert settings.batch_invariant == self.settings.batch_invariant, "batch_invariant is fixed at load"
        if settings.gemv_epilogue and not self.model.folded:
            log.info("gemv_epilogue has no effect on this engine: the norm weights are folded at load, and were not")
        self.release_cuda_graphs()
        self.settings = settings
        self.backend.settings = settings
        self.backend.warm_up(self.dtype)  # the kernels' variants may depend on the settings
        self.model.set_kernel_settings(settings, self._fused())
        self.graph_runner = self._init_cuda_graphs(graph_max_bs)
        self.extend_graphs = self._init_extend_graphs()

    def release_cuda_graphs(self) -> None:
        if self.graph_runner is not None or self.extend_graphs is not None:
            if self.device == "cuda":
                torch.cuda.synchronize()
            self.graph_runner = self.extend_graphs = None
            gc.collect()

    def release_device_memory(self) -> None:
        """At the Engine's shutdown: drop the CUDA graphs, the KV buffers, the req_to_token table, the
        attention backend's buffers and the weights now, even if a reference cycle kept frozen by
        gc.freeze (or a caller) still holds this runner."""
        self.release_cuda_graphs()
        self.kv_pool.release()
        self.req_to_token.release()
        self.backend = None  # type: ignore[assignment]
        release_weights(self.model)
        self.model = None  # type: ignore[assignment]
        if self.device == "cuda":
            torch.cuda.empty_cache()

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """Logits `[len(fb.logits_indices), vocab]` in float32."""
        self.req_to_token.flush()
        if self.pass_hook is not None:
            self.pass_hook(fb)
        if self.graph_runner is not None and self.graph_runner.can_run(fb):
            return self.graph_runner.replay(fb)
        bucket = self.extend_graphs.bucket_for(fb) if self.extend_graphs is not None else None
        if bucket is not None:
            return self.extend_graphs.replay(fb, bucket)
        self.backend.init_forward_metadata(fb)
        hidden = self.model(fb, self.backend)
        return self.model.compute_logits(hidden)


def _context_len(asked: Optional[int], config) -> int:
    """--context-length, at most the model's own (rotary tables and attention past it are untrained; found by
    fuzzing: 99,999,999 failed in the allocator with a traceback), or the model's own."""
    own = _model_context_len(config)
    if asked and own and asked > own:
        raise RadixflowError(f"context_length={asked} is over the model's context ({own}: max_position_embeddings, "
                             f"times its rope scaling factor where that extends it); give at most {own}, or leave it out")
    return asked or own or 4096


def _model_context_len(config) -> Optional[int]:
    """max_position_embeddings, extended by rope scaling where the scaling's factor is not in it already (as vLLM
    reads it): YaRN over original_max_position_embeddings (Qwen2.5 32,768 x 4), linear and dynamic over
    max_position_embeddings; llama3 and longrope configs give the extended length itself."""
    own = getattr(config, "max_position_embeddings", None)
    rope = rope_params(config)
    kind, factor = rope.get("rope_type", rope.get("type")), rope.get("factor")
    if own is None or kind in (None, "default", "llama3", "longrope", "su") or not isinstance(factor, (int, float)):
        return own
    base = rope.get("original_max_position_embeddings", own) if kind == "yarn" else own
    return max(own, int(base * factor))


def release_weights(model: torch.nn.Module) -> None:
    """Every tensor the model's modules hold (parameters, buffers, and plain attributes such as FP8 weights and
    scales) replaced by an empty one: dropping the model is not enough when something still references it (on an
    H200 a freed engine's weights stayed allocated, 9-24 GiB that the next engine's KV pool then lacked)."""
    for module in model.modules():
        for p in module.parameters(recurse=False):
            p.data = p.data.new_empty(0)
        for name, b in list(module.named_buffers(recurse=False)):
            setattr(module, name, b.new_empty(0))
        for name, value in list(vars(module).items()):  # parameters and buffers live in their own dicts, not here
            if isinstance(value, torch.Tensor):
                setattr(module, name, value.new_empty(0))


def _config_from_json(path: str):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path)
    except Exception as e:
        raise RadixflowError(f"cannot read config {path!r}: {e}") from None
