"""ServerArgs' checks: each field's type and range, and the combinations that cannot run. A bad value stops the
launch (or `Engine(...)`) with one line saying what to change, before anything loads; a server never starts on
arguments that would make it refuse, or hang on, every request."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re._constants as sre_constants  # the parser `re` compiles with (the sre_ modules are its deprecated names)
import re._parser as sre_parse
from typing import Any

from radixflow.constrained.options import MAX_GRAMMAR_THREADS
from radixflow.errors import RadixflowError
from radixflow.runtime.extend_graph_args import check_extend_graphs
from radixflow.runtime.sglang_flags import check_sglang_args

_TYPES = {"int": ((int,), "an integer"), "float": ((int, float), "a number"), "bool": ((bool,), "true or false"),
          "str": ((str,), "a string")}
# (field, lowest value, what the value means): None lets a field be left unset
_AT_LEAST = (
    ("page_size", 1, ""), ("max_prefill_tokens", 1, "tokens a prefill pass may take"),
    ("max_batch_size", 1, "requests one call may make"), ("max_new_tokens_limit", 1, "the cap on max_new_tokens"),
    ("max_body_bytes", 1, "a request body's size limit"), ("stream_interval", 1, "tokens between stream chunks"),
    ("grammar_compile_workers", 1, "grammar compiles at once"), ("max_running_requests", 1, ""),
    ("cuda_graph_max_bs", 0, "0 captures no graphs; or use --disable-cuda-graph"), ("dp_size", 1, ""),
    ("fused_rotary_max_batch", 0, "0: never inside the attention kernel"),
    ("jump_forward_max_batch", 0, "0: only a request's first jump, before its prefill"),
    ("in_batch_prefix_threshold", 0, "0: a request sharing any uncached token waits"),
    ("context_length", 1, "tokens; leave it out for the model's own"),
    ("max_total_tokens", 64, "KV slots; leave it out to size the pool from memory"),
)  # fmt: skip
_WHITESPACE = set(" \t\n\r")


def check_args(args: Any, choices: dict) -> None:
    _check_types(args)
    for name, options in choices.items():
        value = getattr(args, name)
        if value not in options and not (value is None and name == "reasoning_parser"):
            raise RadixflowError(f"{name}={value!r}: choose one of {', '.join(map(str, options))}")
    for name, low, meaning in _AT_LEAST:
        value = getattr(args, name)
        if value is not None and value < low:
            raise RadixflowError(f"{name} must be >= {low}" + (f" ({meaning})" if meaning else "") + f", got {value}")
    _check_ranges(args)
    _check_combinations(args)
    check_extend_graphs(args)
    check_sglang_args(args)


def _check_types(args: Any) -> None:
    """The annotated type of every field (Engine(...) takes keyword arguments unchecked by argparse)."""
    for f in dataclasses.fields(args):
        kind = str(f.type).removeprefix("Optional[").removesuffix("]")
        value = getattr(args, f.name)
        if kind not in _TYPES or (value is None and str(f.type).startswith("Optional[")):
            continue
        types, what = _TYPES[kind]
        if not isinstance(value, types) or (kind != "bool" and isinstance(value, bool)):
            raise RadixflowError(f"{f.name}={value!r}: must be {what}")


def _check_ranges(args: Any) -> None:
    if not 0 < args.mem_fraction_static < 1:
        raise RadixflowError(f"mem_fraction_static={args.mem_fraction_static}: give a fraction between 0 and 1 "
                             "(e.g. 0.85), the share of device memory the weights and KV pool may take")
    if args.chunked_prefill_size == 0 or args.chunked_prefill_size < -1:
        raise RadixflowError("chunked_prefill_size must be positive, or -1 to disable chunking")
    if not (math.isfinite(args.grammar_compile_timeout_s) and args.grammar_compile_timeout_s > 0):
        raise RadixflowError("grammar_compile_timeout_s must be a positive number of seconds")
    if not (math.isfinite(args.log_interval_s) and args.log_interval_s > 0):
        raise RadixflowError("log_interval_s must be a positive number of seconds")
    if not 0 <= args.grammar_threads <= MAX_GRAMMAR_THREADS:
        raise RadixflowError(f"grammar_threads must be from 0 (llguidance's default) to {MAX_GRAMMAR_THREADS}; "
                             "more threads than CPUs do not fill masks faster")
    if not 0 <= args.constrained_json_any_depth <= 3:
        raise RadixflowError("constrained_json_any_depth must be from 0 to 3")
    if not 0 < args.port < 65536:
        raise RadixflowError(f"port={args.port}: give a TCP port from 1 to 65535")
    if not 0 <= args.random_seed < 2**63:
        raise RadixflowError(f"random_seed={args.random_seed}: give an integer from 0 to 2^63 - 1")
    if args.api_key == "":
        raise RadixflowError("api_key is empty, which would leave the server open; give a key or leave the flag out")
    if not isinstance(logging.getLevelName(args.log_level.upper()), int):
        raise RadixflowError(f"log_level={args.log_level!r}: use debug, info, warning, error or critical")
    if args.tokenizer_path is not None and not os.path.exists(args.tokenizer_path):
        raise RadixflowError(f"tokenizer_path {args.tokenizer_path!r} does not exist; give a local folder with "
                             "tokenizer.json (nothing is downloaded)")
    if args.constrained_json_whitespace_pattern:
        _check_whitespace_pattern(args.constrained_json_whitespace_pattern)


def _check_combinations(args: Any) -> None:
    if args.enable_deterministic_inference and (args.tp_size > 1 or args.attention_backend == "flashinfer"):
        raise RadixflowError("enable_deterministic_inference needs tp_size 1 and the triton or torch_native attention "
                             "backend")
    if args.quantization not in (None, "fp8"):
        raise RadixflowError(f"quantization={args.quantization!r}: the only quantization is fp8 (or leave it unset)")
    if args.enable_deterministic_inference and (args.quantization or args.kv_cache_dtype != "auto"):
        raise RadixflowError("enable_deterministic_inference runs bf16/fp32 weights and KV cache only; "
                             "drop --quantization / --kv-cache-dtype")
    if args.kv_cache_dtype != "auto" and args.attention_backend == "flashinfer":
        raise RadixflowError("kv_cache_dtype fp8_e4m3 runs with the triton or torch_native attention backend")
    if args.dp_size > 1 and args.nnodes > 1:
        raise RadixflowError("dp_size > 1 runs replicas on this host only; for several hosts start one server per "
                             "host and put sglang-router in front (docs/scale_out.md)")
    if args.dp_size > (os.cpu_count() or 1):  # each replica is a whole server: model, scheduler, detokenizer
        raise RadixflowError(f"dp_size={args.dp_size} is more replicas than this host has CPUs ({os.cpu_count()}); "
                             "each replica is a whole server")


def _check_whitespace_pattern(pattern: str) -> None:
    """The pattern goes between JSON tokens: it may match JSON whitespace only (space, tab, newline, return), else
    the output would not be JSON."""
    from radixflow.constrained.spec import check_regex

    try:
        check_regex(pattern)
        only_whitespace = _matches_only(sre_parse.parse(pattern), _WHITESPACE)
    except (RadixflowError, sre_constants.error, ValueError) as e:
        raise RadixflowError(f"constrained_json_whitespace_pattern: {e}") from None
    if not only_whitespace:
        raise RadixflowError(f"constrained_json_whitespace_pattern {pattern!r} may match more than JSON whitespace "
                             "(space, tab, newline, return); e.g. '[ ]?' or '[ \\n]*'")


def _matches_only(parsed, chars: set) -> bool:
    """Whether every string the parsed regex matches is made of `chars` (literals, classes, groups, repeats and
    alternatives over them; anything else counts as not)."""
    for op, av in parsed:
        if op == sre_constants.LITERAL:
            ok = chr(av) in chars
        elif op == sre_constants.IN:
            ok = all(kind == sre_constants.LITERAL and chr(v) in chars for kind, v in av)
        elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT):
            ok = _matches_only(av[2], chars)
        elif op == sre_constants.SUBPATTERN:
            ok = _matches_only(av[-1], chars)
        elif op == sre_constants.BRANCH:
            ok = all(_matches_only(b, chars) for b in av[1])
        else:
            ok = False
        if not ok:
            return False
    return True
