"""SGLang's launch flags in `radixflow serve`, so that an SGLang launch command runs unchanged or says
what to change: the other names SGLang gives some flags, the flags whose behaviour radixflow always has,
and, for every other flag SGLang documents, why radixflow refuses it and what to use instead."""

from __future__ import annotations

import argparse
import os
from typing import Any

from radixflow.errors import RadixflowError

LOG_TEXT_CHARS = 2048  # --log-requests-level 2: input and output texts cut to this many characters

# ServerArgs field -> SGLang's other names for its flag
ALIASES = {
    "model_path": ("--model",),
    "tp_size": ("--tensor-parallel-size",),
    "dp_size": ("--data-parallel-size",),
    "cuda_graph_max_bs": ("--cuda-graph-max-bs-decode",),
}

# SGLang's names for some values of radixflow's flags: field -> {SGLang's value: radixflow's}
VALUE_ALIASES = {"dtype": {"half": "float16", "float": "float32"}}

# values of radixflow's flags that only SGLang has: field -> {value: what radixflow does instead}
REFUSED_VALUES = {
    "grammar_backend": {"xgrammar": "has no xgrammar backend; leave --grammar-backend out (auto: llguidance, moving "
                        "busy grammars to outlines) or choose llguidance or outlines"},
}

# the help of the ServerArgs fields that are SGLang's serving flags
HELP = {
    "chat_template": "a Jinja chat template file (or a chat_template.json) used instead of the tokenizer's: the "
    "OpenAI chat route, tool calls and programs' user() / assistant() roles render with it",
    "stream_response_default_include_usage": "OpenAI streams end with a usage chunk unless the request's "
    "stream_options.include_usage is false",
    "enable_mixed_chunk": "the running requests' next tokens ride in the extend pass of newly admitted prompts "
    "(prefill chunks included; one read of the weights for both), unless an admitted prompt wants input logprobs",
    "sampling_defaults": "where OpenAI requests that leave out temperature, top_p, top_k, min_p or "
    "repetition_penalty take them from: model = the model's generation_config.json where it sets them, else "
    "SGLang's defaults; openai = SGLang's defaults",
    "log_requests": "log every finished request: its rid, token counts, finish reason and latency, and by "
    "--log-requests-level its sampling parameters, input and output",
    "log_requests_level": "what --log-requests logs: 0 counts, 1 and the sampling parameters, 2 and the input and "
    f"output cut to {LOG_TEXT_CHARS} characters, 3 all of them",
}

# flags that change nothing here: what they ask for radixflow always does
ALWAYS = {
    "--trust-remote-code": "accepted for SGLang's launch commands: radixflow runs its own model code, never a "
    "model repository's, so there is nothing to trust",
    "--enable-metrics": "accepted for SGLang's launch commands: GET /metrics is always served",
    "--enable-cache-report": "accepted for SGLang's launch commands: OpenAI responses always report "
    "usage.prompt_tokens_details.cached_tokens",
    "--disable-custom-all-reduce": "accepted for SGLang's launch commands: tensor parallelism all-reduces through "
    "NCCL unless --enable-one-shot-allreduce is given",
    "--skip-server-warmup": "accepted for SGLang's launch commands: the server sends itself no warm-up request (its "
    "CUDA graphs are captured before the port opens)",
}

_HIERARCHICAL = ("keeps the radix cache in GPU memory only (no host-memory tier); size the pool with "
                 "--mem-fraction-static or --max-total-tokens")  # fmt: skip
_LORA = "serves no LoRA adapters; merge the adapter into the weights and serve the merged model"
_ATTENTION = "has one --attention-backend for prefill and decode"
_SAMPLING = ("takes no server-wide sampling parameters: a request's own, else (OpenAI routes, --sampling-defaults "
             "model) the model's generation_config.json, else SGLang's defaults")

# SGLang's other flags: what radixflow does instead (the error says "radixflow " + this)
REFUSED = {
    "--revision": "loads models from local paths only (no model hub); pass --model-path the folder of that revision",
    "--is-embedding": "serves generative models only",
    "--enable-lora": _LORA,
    "--lora-paths": _LORA,
    "--speculative-algorithm": "has no speculative decoding",
    "--pp-size": "has no pipeline parallelism; use --tp-size (with --nnodes across hosts) or --dp-size",
    "--ep-size": "serves dense models only (no expert parallelism)",
    "--enable-hierarchical-cache": _HIERARCHICAL,
    "--enable-hicache": _HIERARCHICAL,
    "--hicache-ratio": _HIERARCHICAL,
    "--hicache-size": _HIERARCHICAL,
    "--enable-torch-compile": "does not use torch.compile: decode replays CUDA graphs of its own Triton kernels",
    "--prefill-attention-backend": _ATTENTION,
    "--decode-attention-backend": _ATTENTION,
    "--sampling-backend": "samples with its own Triton kernel (--disable-triton-sampling: torch's)",
    "--skip-tokenizer-init": "always loads the tokenizer; requests may still send input_ids",
    "--completion-template": "has no completion (fill-in-the-middle) templates",
    "--enable-priority-scheduling": "has no request priorities; --schedule-policy picks lpm or fcfs",
    "--schedule-conservativeness": "keeps decode room by --admission-rule (peak: the pool's projected peak; "
    "ratio: SGLang's new-token ratio)",
    "--max-queued-requests": "queues every request it accepts; bound a call with --max-batch-size and "
    "--max-body-bytes",
    "--radix-eviction-policy": "evicts the least recently used leaves (SGLang's default, lru); leave the flag out",
    "--preferred-sampling-params": _SAMPLING,
    "--incremental-streaming-output": "streams the whole text so far in each native-API chunk and deltas in the "
    "OpenAI API's, as SGLang does without this flag",
    "--admin-api-key": "has one --api-key for every route",
    "--enable-custom-logit-processor": "has no custom logit processors",
    "--base-gpu-id": "uses the first GPUs the process sees (cuda:0 and up); pick others with CUDA_VISIBLE_DEVICES",
}


class _Refused(argparse.Action):
    """A flag of REFUSED: listed in --help, an error naming what radixflow does instead if given."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(f"{option_string} is SGLang's: radixflow {REFUSED[option_string]}")


def add_sglang_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of ALWAYS (accepted; ServerArgs has no field for them) and of REFUSED, in --help."""
    always = parser.add_argument_group("SGLang's flags that change nothing here")
    for flag, why in ALWAYS.items():
        always.add_argument(flag, action="store_true", help=why)
    refused = parser.add_argument_group("SGLang's flags that radixflow refuses, and what it does instead")
    for flag, why in REFUSED.items():
        refused.add_argument(flag, action=_Refused, nargs="*", default=argparse.SUPPRESS, help=f"radixflow {why}")


def sglang_values(args: Any) -> None:
    """SGLang's names for values made radixflow's (VALUE_ALIASES); a value only SGLang has, refused (REFUSED_VALUES)."""
    for name, aliases in VALUE_ALIASES.items():
        setattr(args, name, aliases.get(getattr(args, name), getattr(args, name)))
    for name, refused in REFUSED_VALUES.items():
        value = getattr(args, name)
        if isinstance(value, str) and value in refused:
            raise RadixflowError(f"--{name.replace('_', '-')} {value} is SGLang's: radixflow {refused[value]}")


def cli_choices(name: str, choices: Any) -> Any:
    """argparse's choices for a field: radixflow's values, then SGLang's names that sglang_values() handles."""
    if choices is None:
        return None
    return (*choices, *VALUE_ALIASES.get(name, {}), *REFUSED_VALUES.get(name, {}))


def flag_conflict(namespace: argparse.Namespace) -> str:
    """What contradicts itself among the parsed flags ("" if nothing): an ALWAYS flag whose promise another breaks."""
    if getattr(namespace, "disable_custom_all_reduce", False) and getattr(namespace, "enable_one_shot_allreduce", False):
        return "--disable-custom-all-reduce asks for NCCL's all-reduce alone: drop --enable-one-shot-allreduce"
    return ""


def check_sglang_args(args: Any) -> None:
    """ServerArgs' checks of its SGLang serving flags (RadixflowError says what to change)."""
    if args.chat_template is not None and not os.path.isfile(args.chat_template):
        raise RadixflowError(f"chat_template {args.chat_template!r} is not a file: give a Jinja chat template file "
                             "(or a chat_template.json); SGLang's built-in template names are not supported")
    if args.log_requests_level not in (0, 1, 2, 3):
        raise RadixflowError(f"log_requests_level={args.log_requests_level}: choose 0, 1, 2 or 3")
