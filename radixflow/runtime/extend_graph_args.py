"""Which server arguments let extend passes replay from CUDA graphs (--cuda-graph-extend-max-tokens):
an explicit size that cannot run is refused when ServerArgs is built; the default (no size) is only
turned off, and ModelRunner logs why (execution/model_runner.py decides the rest: FP8 checkpoints,
memory)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

from radixflow.errors import RadixflowError

if TYPE_CHECKING:
    from radixflow.runtime.server_args import ServerArgs

log = logging.getLogger(__name__)

# the extend graphs' default buckets on CUDA: session 9's H200 call measured these (react, llm_judge)
DEFAULT_EXTEND_GRAPH_TOKENS, DEFAULT_EXTEND_GRAPH_REQS = 512, 256


def check_extend_graphs(args: ServerArgs) -> None:
    """An explicit --cuda-graph-extend-max-tokens N that cannot run is an error."""
    n = args.cuda_graph_extend_max_tokens
    if n is not None and n < 0:
        raise RadixflowError("cuda_graph_extend_max_tokens must be >= 0 (0: extend passes run eagerly)")
    if args.cuda_graph_extend_max_reqs < 1:
        raise RadixflowError("cuda_graph_extend_max_reqs must be >= 1")
    if not n:
        return
    if args.disable_cuda_graph_extend:
        raise RadixflowError(f"cuda_graph_extend_max_tokens={n} and disable_cuda_graph_extend contradict each "
                             "other; drop one of them")
    if args.disable_cuda_graph:
        log.warning("cuda_graph_extend_max_tokens is ignored with disable_cuda_graph: extend passes run eagerly")
        return
    blocker = extend_graph_blocker(args, args.resolved_device(), explicit=True)
    if blocker:
        raise RadixflowError(f"cuda_graph_extend_max_tokens={n}: {blocker}; drop the option (or set 0) to run "
                             "extend passes eagerly")


def extend_graph_blocker(args: ServerArgs, device: str, explicit: bool = False, fp8: bool = False) -> Optional[str]:
    """Why extend passes cannot (or by default do not) replay from CUDA graphs on `device`, else None.
    `explicit`: a size was set, which allows the CPU's padded passes and FP8. `fp8`: the checkpoint's
    own FP8 weights (its config's quantization_config), known once the model's config is read."""
    cuda = str(device).startswith("cuda")
    if args.tp_size > 1:  # the graphs would capture all-reduces on every rank
        return "not supported with tp_size > 1 yet (not run on several GPUs)"
    if cuda:  # the backend's capability decides, not its name (the CPU's padded passes capture nothing)
        from radixflow.runtime.execution.attention import attention_backend_class

        backend = attention_backend_class(args.attention_backend, "cuda")
        if not backend.supports_extend_graph:
            return f"needs the triton attention backend (the {backend.__name__} cannot replay extend passes from CUDA graphs)"
    if args.enable_deterministic_inference:
        return "pads extend passes, which enable_deterministic_inference does not allow for"
    if not explicit and not cuda:
        return "no CUDA device (set a size to run the padded passes without graphs)"
    if not explicit and (fp8 or args.quantization is not None or args.kv_cache_dtype != "auto"):
        return "FP8 with extend graphs has not run on a GPU yet (set a size to turn them on)"
    return None


def extend_graph_off(args: ServerArgs, device: str, fp8: bool = False) -> Optional[str]:
    """Why extend passes run eagerly on `device`, None when they are padded to buckets (replayed
    from CUDA graphs; on the CPU run without graphs, when a size was set)."""
    if args.disable_cuda_graph_extend or args.cuda_graph_extend_max_tokens == 0:
        return "turned off (--disable-cuda-graph-extend or --cuda-graph-extend-max-tokens 0)"
    if args.disable_cuda_graph:  # check_extend_graphs warned when a size was set
        return "--disable-cuda-graph"
    if args.cuda_graph_extend_max_tokens is not None:  # check_extend_graphs refused what cannot run
        return None
    return extend_graph_blocker(args, device, fp8=fp8)


def extend_graph_tokens(args: ServerArgs, device: str, fp8: bool = False) -> int:
    """The extend graphs' largest token bucket on `device`, 0 when extend passes run eagerly: the size
    set, or DEFAULT_EXTEND_GRAPH_TOKENS where nothing keeps the graphs off."""
    if extend_graph_off(args, device, fp8):
        return 0
    return args.cuda_graph_extend_max_tokens or DEFAULT_EXTEND_GRAPH_TOKENS
