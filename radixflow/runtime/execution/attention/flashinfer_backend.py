"""Attention through FlashInfer (optional: needs the flashinfer package and a CUDA device).

The KV pool is a paged cache of one token a page, so a request's page list is its row of
req_to_token. Once per forward pass the backend builds the batch's kv_indptr on the host
(from the lengths the scheduler keeps there) and its kv_indices on the GPU, and plans a
FlashInfer wrapper that every layer then runs:

- decode: BatchDecodeWithPagedKVCacheWrapper, with tensor cores (FlashInfer's prefill
  kernel) when a KV head serves 4 or more query heads, where they beat the CUDA-core kernel;
- extend: BatchPrefillWithPagedKVCacheWrapper over cached prefix + new tokens, causal.

K/V are stored by the Triton kernels of the Triton backend (the store is fused with rotary).

CUDA graphs: plan() runs on the host and copies its schedule into the workspace, so it
cannot be captured. A decode graph runs a wrapper bound to fixed index buffers, re-planned
before every replay: the graph runner has to call `init_cuda_graph_capture` before capturing
a batch size and `init_cuda_graph_replay` before each replay (AttentionBackend's hooks,
called outside the capture).
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from radixflow.errors import RadixflowError
from radixflow.kernels.pdl import pdl_launch
from radixflow.runtime.execution.attention.triton_backend import TritonBackend
from radixflow.runtime.execution.forward_batch import ForwardBatch, ForwardMode

log = logging.getLogger(__name__)

WORKSPACE_BYTES = 256 << 20  # FlashInfer's float workspace (split-KV partial outputs), shared by all wrappers
TENSOR_CORE_MIN_GROUP = 4  # query heads per KV head from which decode runs on tensor cores
FLASHINFER_VERSION = "0.3.1.post1"  # the API this backend is written against


def import_flashinfer():
    try:
        import flashinfer
    except ImportError as e:
        raise RadixflowError(
            f"attention_backend=flashinfer needs the flashinfer package, which does not import ({e}): "
            f"pip install flashinfer-python=={FLASHINFER_VERSION}, or use attention_backend=triton"
        ) from None
    return flashinfer


def kv_indptr(lens: list[int], pad: int = 0) -> torch.Tensor:
    """Host int32 prefix sums [0, l0, l0 + l1, ...] of `lens`, then of `pad` one-token requests."""
    return torch.tensor(list(itertools.accumulate(lens + [1] * pad, initial=0)), dtype=torch.int32)


def kv_indices(table: torch.Tensor, rows: torch.Tensor, lens: torch.Tensor, total: int) -> torch.Tensor:
    """table[rows[b], :lens[b]] for every request b, concatenated, on the table's device.
    `total` = sum(lens) is known on the host, so nothing here waits for the GPU."""
    dev = table.device
    req = torch.repeat_interleave(torch.arange(rows.numel(), device=dev), lens, output_size=total)
    starts = torch.cumsum(lens, 0) - lens
    cols = torch.arange(total, device=dev) - starts[req]
    return table[rows[req], cols]


@dataclass
class FlashInferPlan:
    wrapper: Any  # a planned FlashInfer wrapper; every layer of the pass runs it
    graph: bool = False  # planned by the CUDA-graph hooks: init_forward_metadata keeps it


class FlashInferBackend(TritonBackend):
    supports_cuda_graph = True  # through init_cuda_graph_capture / init_cuda_graph_replay
    supports_extend_graph = False  # its extend wrapper is planned on the host for each pass
    gemv_epilogues = False  # no norm fold: never tested with the folded model (flashinfer is not in the H200 image)
    def __init__(self, decode_tensor_cores: bool | None = None, **kwargs):
        """decode_tensor_cores: None = by the number of query heads per KV head (benchmarks force it)."""
        fi = import_flashinfer()  # first: the error that names the fix
        super().__init__(**kwargs)
        pool = self.kv_pool
        if pool.page_size != 1:
            raise RadixflowError(f"attention_backend=flashinfer supports page_size 1 only (got {pool.page_size})")
        if pool.dtype not in (torch.float16, torch.bfloat16):
            raise RadixflowError(
                f"attention_backend=flashinfer needs dtype bfloat16 or float16 (got {pool.dtype}); "
                "use attention_backend=triton for float32"
            )
        self.device = pool.k[0].device
        if self.device.type != "cuda":
            raise RadixflowError("attention_backend=flashinfer needs a CUDA device; use torch_native on CPU")
        self.fi = fi
        group = self.num_q_heads // self.num_kv_heads
        self.tensor_cores = group >= TENSOR_CORE_MIN_GROUP if decode_tensor_cores is None else decode_tensor_cores
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.decode = fi.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", use_tensor_cores=self.tensor_cores)
        self.extend = fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend="fa2")
        self.graph_wrappers: dict[int, Any] = {}
        self._graph_bufs: tuple | None = None
        self._plan_done: dict[int, torch.cuda.Event] = {}
        self._warm_up()

    # -- per pass ------------------------------------------------------------------------------
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if isinstance(fb.attn_metadata, FlashInferPlan) and fb.attn_metadata.graph:
            return
        indices = self._indices(fb)
        if fb.mode == ForwardMode.DECODE:
            self._plan_decode(self.decode, kv_indptr(fb.seq_lens_list), indices)
            fb.attn_metadata = FlashInferPlan(self.decode)
            return
        self._plan_extend(kv_indptr(fb.extend_lens_list), kv_indptr(fb.seq_lens_list), indices)
        fb.attn_metadata = FlashInferPlan(self.extend)

    def rotary_in_attention(self, fb: ForwardBatch) -> bool:
        return False  # FlashInfer attends: rotary and the KV store stay in the Triton kernel before it

    def flash_enabled(self) -> bool:
        return False  # FlashInfer's extend wrapper attends every row, prompt-only ones included

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, fb: ForwardBatch) -> torch.Tensor:
        """The planned wrapper over the pool (k/v, already stored there, are not read again)."""
        return self._run(fb.attn_metadata.wrapper, q, layer)

    def _run(self, wrapper, q: torch.Tensor, layer: int) -> torch.Tensor:
        kv = (self.kv_pool.k[layer].unsqueeze(1), self.kv_pool.v[layer].unsqueeze(1))  # [slots, page 1, Hkv, D]
        return wrapper.run(q, kv, enable_pdl=bool(pdl_launch(q, self.settings)["USE_PDL"]))

    # -- CUDA graphs -----------------------------------------------------------------------------
    def init_cuda_graph_capture(self, fb: ForwardBatch) -> None:
        """Before capturing decode at fb.batch_size (outside the capture): a fixed-buffer wrapper,
        planned for the runner's dummy batch (each row one token, in the scratch slot 0)."""
        bs = fb.batch_size
        wrapper = self._graph_wrapper(bs)
        self._plan_decode(wrapper, kv_indptr([], pad=bs), torch.zeros(bs, dtype=torch.int32, device=self.device))
        fb.attn_metadata = FlashInferPlan(wrapper, graph=True)

    def init_cuda_graph_replay(self, fb: ForwardBatch, padded_bs: int) -> None:
        """Before replaying the graph of `padded_bs` for the real batch `fb`: its indices into
        the fixed buffers, and a new plan. Padding rows attend to the scratch slot 0."""
        pad = padded_bs - fb.batch_size
        indices = self._indices(fb)
        self._plan_decode(self.graph_wrappers[padded_bs], kv_indptr(fb.seq_lens_list, pad), F.pad(indices, (0, pad)))

    def _graph_wrapper(self, bs: int):
        if bs not in self.graph_wrappers:
            if self._graph_bufs is None or self._graph_bufs[2].numel() < bs:
                # shared by the graph wrappers, as only the one about to replay is planned; sized by
                # the first and largest batch the runner captures (a larger one gets new buffers)
                cols = self.req_to_token.table.shape[1]
                i32 = {"dtype": torch.int32, "device": self.device}
                self._graph_bufs = (torch.zeros(bs + 1, **i32), torch.zeros(bs * cols, **i32), torch.ones(bs, **i32))
            indptr, indices, last = self._graph_bufs
            self.graph_wrappers[bs] = self.fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=self.tensor_cores,
                paged_kv_indptr_buffer=indptr[: bs + 1], paged_kv_indices_buffer=indices,
                paged_kv_last_page_len_buffer=last[:bs],
            )  # fmt: skip
        return self.graph_wrappers[bs]

    # -- helpers ---------------------------------------------------------------------------------
    def _indices(self, fb: ForwardBatch) -> torch.Tensor:
        return kv_indices(self.req_to_token.table, fb.req_pool_indices, fb.seq_lens, sum(fb.seq_lens_list))

    @staticmethod
    def _last_page_lens(bs: int) -> torch.Tensor:
        return torch.ones(bs, dtype=torch.int32)  # on the host: plan() reads it there

    def _plan_decode(self, wrapper, indptr: torch.Tensor, indices: torch.Tensor) -> None:
        self._plan(
            wrapper, indptr, indices, self._last_page_lens(indptr.numel() - 1), self.num_q_heads, self.num_kv_heads,
            self.head_dim, 1, sm_scale=self.scale, q_data_type=self.kv_pool.dtype, kv_data_type=self.kv_pool.dtype,
        )  # fmt: skip

    def _plan_extend(self, qo_indptr: torch.Tensor, indptr: torch.Tensor, indices: torch.Tensor) -> None:
        self._plan(
            self.extend, qo_indptr, indptr, indices, self._last_page_lens(indptr.numel() - 1), self.num_q_heads,
            self.num_kv_heads, self.head_dim, 1, causal=True, sm_scale=self.scale, q_data_type=self.kv_pool.dtype,
            kv_data_type=self.kv_pool.dtype,
        )  # fmt: skip

    def _plan(self, wrapper, *args, **kwargs) -> None:
        """wrapper.plan, after the wrapper's previous plan left the host: plan() rewrites a pinned
        host buffer and copies it to the GPU asynchronously, and with overlapped decode the host
        plans step n + 1 while step n may not have reached that copy yet."""
        done = self._plan_done.get(id(wrapper))
        if done is None:
            done = self._plan_done[id(wrapper)] = torch.cuda.Event()
        done.synchronize()  # returns at once while never recorded
        wrapper.plan(*args, **kwargs)
        done.record()

    def _warm_up(self) -> None:
        """Plan and run one-token extend and decode passes over the scratch slot, so the kernels
        are built (JIT-compiled on first use, then cached by FlashInfer) or fail at start-up."""
        start = time.perf_counter()
        q = torch.zeros(1, self.num_q_heads, self.head_dim, dtype=self.kv_pool.dtype, device=self.device)
        slot0 = torch.zeros(1, dtype=torch.int32, device=self.device)
        try:
            self._plan_extend(kv_indptr([1]), kv_indptr([1]), slot0)
            self._run(self.extend, q, 0)
            self._plan_decode(self.decode, kv_indptr([1]), slot0)
            self._run(self.decode, q, 0)
            torch.cuda.synchronize(self.device)
        except Exception as e:  # JIT failures surface as RuntimeError with the compiler's output
            raise RadixflowError(
                f"FlashInfer could not build or run its kernels; use attention_backend=triton. Cause: {str(e)[-3000:]}"
            ) from e
        version = getattr(self.fi, "__version__", "?")
        log.info("FlashInfer %s kernels ready in %.1fs", version, time.perf_counter() - start)
