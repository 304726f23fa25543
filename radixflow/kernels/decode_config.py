"""Launch parameters of kernels/decode_attention.py's kernels: the defaults, the entries that override them for a
pool kind, batch size, shape and device, and how a launch resolves them.

DECODE_CONFIG (benchmarks/gpu_attn_bench.py, fp8_attn_bench.py and bf16_attn_bench.py sweep it):
block_n / num_warps / num_stages of stage 1; `waves` and `max_splits` for num_kv_splits; `direct`:
with one split, stage 1 writes the normalised output itself and stage 2 is skipped; `split_align`:
splits are cut at multiples of this many tokens (0: block_n), so a short sequence spreads over more splits than
whole blocks would give it; `small`: overrides for batch <= small["max_batch"] (the batch-1
graph); `fp8`: overrides for an FP8 pool from batch fp8["min_batch"] up, where its other gates pass;
a pool entry's `large`: launch keys over the entry's own from large["min_batch"] up (a caller's entry
without one has none); `fp8_fallback`: the same as `fp8` where the `fp8` entry's gates fail (the entry it replaced, `FALLBACKS`); `bf16` /
`fp16`: the same for bf16 / fp16 pools (`pool_kind`). A pool entry's gates (POOL_GATES) limit it to what was
timed: min_batch, min_shared_memory (the bytes of shared memory the device allows a block, `entry_fits`),
head_dim, min_kv_heads (the KV heads a rank holds), sm_major (the device's compute capability major);
`fixed_splits`: when set, every batch size uses this many splits; `fp8_f16`: an FP8 pool's K / V are
widened to float16 for the products (False: to q's dtype; kept for A/B); `fp8_v_regs`: with fp8_f16, V
is widened in registers before it goes through shared memory (attention_common.e4m3_to_f16_in_registers;
False: where Triton puts it, kept for A/B); `fp8_exp2`: an FP8 pool's scores in log2 units, exponentiated
by attention_common.exp2_ftz; `maxnreg`: a cap on stage 1's registers a thread (Triton's launch option; 0: none),
so more programs fit an SM. A caller's `config` replaces DECODE_CONFIG's keys it names; its own `small` /
pool entries win over its top-level keys at their batch sizes, DECODE_CONFIG's pool entries do not
(`resolve_config`).

DETERMINISTIC_CONFIG fixes every parameter whatever the batch size, so how a sequence is cut,
and the order its splits merge in, depend on its own length alone: a request's output is the
same bits in any batch (--enable-deterministic-inference).
"""

from __future__ import annotations

import functools

import torch
import triton

# Launch parameters, chosen by benchmarks/gpu_attn_bench.py (Llama-3-8B heads, KV slots scattered,
# each layer call timed in a CUDA graph against the previous parameters):
# - large batches: 4 warps, and no stage 2 when there is one split (the partials never leave registers);
# - batch 1 (`small`): up to 32 splits cut at 16-token multiples, so short sequences use all of them.
# Several KV heads per program, an elementwise (no tl.dot) path, an in-kernel merge by the last
# split, head-major program order and a register cap were each slower in that sweep and were removed.
# - FP8 pools from batch 256 (`fp8`, chosen by benchmarks/fp8_attn_bench.py at the offline pass's shapes):
#   2 warps, 5 stages (the next blocks' gathered K / V stay in flight during the products), scores in log2
#   units. The kernel, not the pool's layout, held the FP8 pool's read rate: a gather-only probe reads it at
#   the bf16 pool's rate. Timed on an H200 with 128-dim heads at batch >= 256, at 8 KV heads and (session 11,
#   `fp8_attn_bench.py --kv-heads 4 / 1`: 1.03-1.16x the fallback) at a TP rank's 4 and 1, hence min_kv_heads 1.
#   Elsewhere from batch 256 (other GPUs, head sizes) an FP8 pool keeps the entry it had before
#   (`fp8_fallback`: 128-token blocks, 4 warps, 5 stages, wherever a block may have ~105 KiB of shared memory;
#   1.00-1.15x the launch above with V widened in registers at 8 KV heads in the same run), and below 256 that
#   launch. The history has it. From batch 512 (`large`, session 16): one warp, 32-token blocks, 5 stages, at most
#   168 registers a thread. Nsight Compute found the 2-warp launch latency-bound (2 warps a scheduler, stalled on
#   shared-memory reads and the e4m3 conversions); one-warp programs fit more to an SM. Against the 2-warp launch,
#   two calls: 1,000 x 1,500 tokens 807 / 880 us and 842 / 859, 768 x U[32, 1536] 269 / 297 and 272 / 272, 512 x
#   1,536 431 / 453 and 438 / 444; 256 x 1,536 238 / 231 (slower: hence min_batch 512). In the engine, the 1,000 in /
#   1,000 out workload 1.018x (15,379 / 15,102 out tok/s), the offline pass 1.006x; the 2-warp launch's 168-register
#   neighbours at 1 warp (144-192, 4-8 stages, 16-token blocks) were all slower.
# - bf16 pools from batch 16 (`bf16`, chosen by benchmarks/bf16_attn_bench.py at the offline pass's batch
#   sizes and contexts): 2 warps. Timed only on an H200 (sm_90), 128-dim heads, 8 KV heads in groups of 4
#   (Llama-3-8B unsharded: from batch 256 one split per request, no stage 2), attention p in 2 parts, and there
#   Triton 3.6 compiles it to 255 registers: at the register cliff. Hence the gates: other head sizes (256 spills
#   at 2 warps), other GPUs, and tensor-parallel ranks with fewer than 8 KV heads (more splits and stage 2, a grid
#   not timed with 2 warps) keep the launch above. Warps cost registers, not shared memory: no
#   min_shared_memory. fp16 pools (`fp16`) were not timed: no entry.
#   benchmarks/history/2026-12-02.md has the sweep. Session 22 timed the program suite's decode batches
#   (bf16_attn_bench.py's MID_CASES: batch 16-200 over 516-token contexts and 64 / 128 rows of U[200, 1500] /
#   U[100, 1200]): the same 2-warp launch at the same split counts was the fastest over them, 1.05-1.18x the
#   4-warp one (1.08x geometric mean), hence min_batch 16 (batches 2-15 were not timed).
DECODE_CONFIG = {
    "block_n": 64, "num_warps": 4, "num_stages": 3, "waves": 4, "max_splits": 16, "split_align": 0, "direct": True,
    "small": {"max_batch": 1, "max_splits": 32, "split_align": 16}, "fixed_splits": 0, "fp8_f16": True,
    "fp8_v_regs": True, "fp8_exp2": False, "maxnreg": 0,
    "fp8": {"block_n": 64, "num_warps": 2, "num_stages": 5, "fp8_exp2": True,
            "min_batch": 256, "head_dim": 128, "min_kv_heads": 1, "sm_major": 9,
            "large": {"min_batch": 512, "block_n": 32, "num_warps": 1, "num_stages": 5, "maxnreg": 168}},
    "fp8_fallback": {"block_n": 128, "num_warps": 4, "num_stages": 5, "min_batch": 256, "min_shared_memory": 110_000},
    "bf16": {"num_warps": 2, "min_batch": 16, "head_dim": 128, "min_kv_heads": 8, "sm_major": 9},
    "fp16": {},
}
DETERMINISTIC_CONFIG = {"small": {}, "fp8": {}, "bf16": {}, "fp16": {}, "fixed_splits": 16, "split_align": 16,
                        "direct": False}


POOL_KINDS = {torch.float8_e4m3fn: "fp8", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "float32"}
POOL_ENTRIES = ("fp8", "bf16", "fp16")  # entries named after the pool kind (pool_kind) they launch
FALLBACKS = {"fp8": "fp8_fallback"}  # a pool's entry where its own entry's gates fail
POOL_GATES = ("min_batch", "min_shared_memory", "head_dim", "min_kv_heads", "sm_major")
ENTRY_GATES = {"small": ("max_batch",), **{name: POOL_GATES for name in (*POOL_ENTRIES, *FALLBACKS.values())}}
LAUNCH_KEYS = set(DECODE_CONFIG) - set(ENTRY_GATES)


def pool_kind(dtype: torch.dtype) -> str:
    """The KV pool's kind as DECODE_CONFIG's entries name it: "fp8", "bf16", "fp16" or "float32"."""
    if dtype not in POOL_KINDS:
        raise ValueError(f"decode_attention: no KV pool of {dtype}; pools: {', '.join(map(str, POOL_KINDS))}")
    return POOL_KINDS[dtype]


def _check_keys(config: dict) -> None:
    """ValueError for a key DECODE_CONFIG does not have, at the top level or in its `small` / pool entries."""
    unknown = set(config) - set(DECODE_CONFIG)
    for name, gates in ENTRY_GATES.items():
        allowed = LAUNCH_KEYS | set(gates) | ({"large"} if name != "small" else set())
        unknown |= {f"{name}.{k}" for k in set(config.get(name, ())) - allowed}
        unknown |= {f"{name}.large.{k}" for k in set(config.get(name, {}).get("large", ())) - LAUNCH_KEYS - {"min_batch"}}
    if unknown:
        raise ValueError(f"decode_attention: unknown config keys {sorted(unknown)}")


def entry_fits(entry: dict) -> bool:
    """Whether the current CUDA device passes the entry's device gates: a block may have min_shared_memory bytes
    of shared memory, its compute capability major is sm_major (true on the CPU: the interpreter has neither)."""
    if not torch.cuda.is_available():
        return True
    major, optin = _device_limits(torch.cuda.current_device())
    need = entry.get("min_shared_memory", 0)
    fits = not need or (optin >= need if optin is not None else major >= 9)  # sm_90 / sm_100 give 227 KiB
    return fits and entry.get("sm_major", major) == major


@functools.lru_cache(maxsize=None)
def _device_limits(device: int) -> tuple[int, int | None]:
    """(compute capability major, shared memory a block may opt into or None), asked once per device:
    resolve_config runs for every decode launch (every layer of an eager pass)."""
    props = torch.cuda.get_device_properties(device)
    return props.major, getattr(props, "shared_memory_per_block_optin", None)


def _shape_fits(entry: dict, head_dim: int | None, kv_heads: int | None) -> bool:
    """Whether the entry's shape gates pass; an unknown head size or KV head count fails a gate that names it."""
    if "head_dim" in entry and entry["head_dim"] != head_dim:
        return False
    return "min_kv_heads" not in entry or (kv_heads or 0) >= entry["min_kv_heads"]


def _entry(batch: int, small: dict, pool_entries: list[tuple[str, dict]], head_dim: int | None,
           kv_heads: int | None) -> tuple[str | None, dict]:
    """The name and launch overrides (gates left out) of the entry that applies at this batch size: `small`, else the
    first of the pool's (name, entry) whose gates pass; or (None, {})."""
    if batch <= small.get("max_batch", 0):
        return "small", {k: v for k, v in small.items() if k not in ENTRY_GATES["small"]}
    for name, entry in pool_entries:
        if batch >= entry.get("min_batch", 0) and _shape_fits(entry, head_dim, kv_heads) and entry_fits(entry):
            return name, _launch_of(entry, batch)
    return None, {}


def _launch_of(entry: dict, batch: int) -> dict:
    """A pool entry's launch keys at this batch size: its own, with its `large` launch's over them from that
    launch's min_batch up."""
    launch = {k: v for k, v in entry.items() if k not in POOL_GATES and k != "large"}
    large = entry.get("large", {})
    if large and batch >= large["min_batch"]:
        launch.update({k: v for k, v in large.items() if k != "min_batch"})
    return launch


def resolve_config(batch: int, config: dict | None = None, *, pool: str | None = None, head_dim: int | None = None,
                   kv_heads: int | None = None) -> dict:
    """The launch parameters for this batch size, pool kind (`pool_kind`; None: no pool entry), head size and KV
    head count (None: unknown, so no entry gated on it applies). From the bottom up: DECODE_CONFIG's top-level
    keys, DECODE_CONFIG's entry that applies (`small`, the pool's or its fallback), `config`'s top-level keys,
    `config`'s own entry that applies. A `config` without `small` has none (sweeps give whole launches); one without
    the pool's entry (or its fallback) keeps DECODE_CONFIG's."""
    if pool is not None and pool not in POOL_KINDS.values():
        raise ValueError(f"decode_attention: pool {pool!r} is none of {sorted(POOL_KINDS.values())}")
    config = config or {}
    _check_keys(config)
    small = config.get("small", {} if config else DECODE_CONFIG["small"])
    names = [n for n in (pool, FALLBACKS.get(pool)) if n in ENTRY_GATES]  # the pool's entry, then its fallback
    name, entry = _entry(batch, small, [(n, config.get(n, DECODE_CONFIG[n])) for n in names], head_dim, kv_heads)
    base = {k: v for k, v in DECODE_CONFIG.items() if k in LAUNCH_KEYS}
    own = {k: v for k, v in config.items() if k in LAUNCH_KEYS}
    return {**base, **own, **entry} if name in config else {**base, **entry, **own}


def num_kv_splits(batch: int, kv_heads: int, num_sms: int = 132, waves: int | None = None,
                  config: dict | None = None, *, pool: str | None = None, head_dim: int | None = None) -> int:
    """Enough (request, KV head, split) programs to cover the SMs `waves` times, a power of two capped at
    max_splits. Depends on the batch size, head counts, head size and pool kind only (CUDA graphs); give
    decode_attention's pool and head size, so an entry that changes the split count applies to both alike."""
    cfg = resolve_config(batch, config, pool=pool, head_dim=head_dim, kv_heads=kv_heads)
    if cfg["fixed_splits"]:
        return cfg["fixed_splits"]
    waves = cfg["waves"] if waves is None else waves
    programs = max(batch * kv_heads, 1)
    return min(cfg["max_splits"], triton.next_power_of_2(max(-(-waves * num_sms // programs), 1)))
