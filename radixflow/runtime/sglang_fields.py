"""Top-level request fields that SGLang accepts on a route but radixflow does not act on.

Clients and sglang-router send SGLang's fields (the router adds `return_hidden_states`,
`continue_final_message`, `bootstrap_*`, `data_parallel_rank`, ... to what it forwards).
Every route refuses a field it does not know; a field SGLang knows is accepted when
its value leaves the output unchanged:

- `ANY`: routing or bookkeeping only (data_parallel_rank, priority, custom_labels, ...);
- a type (`str`, `bool`, `dict`): bookkeeping fields OpenAI types (`user`, `store`, ...): any value of that
  type, or null;
- otherwise only the listed "off" values (None, False, its default), or an empty or
  all-off per-prompt list. Anything else is a 400 naming the field.

The field lists follow SGLang's GenerateReqInput (io_struct.py) and its OpenAI
CompletionRequest / ChatCompletionRequest (protocol.py); fields radixflow supports are
handled by each route and are not listed here.
"""

from __future__ import annotations

from typing import Any

from radixflow.errors import RadixflowError

ANY = "any value"
_NULL = (None,)
_FALSE = (None, False)

# sampling_params entries SGLang knows that change nothing here: text is always decoded as the
# tokenizer decodes it, and a stream sends every step (the server's --stream-interval); and SGLang's
# entries for what radixflow has not (beam search, watermarks, custom logit processors) at their off values.
SAMPLING = {"spaces_between_special_tokens": (None, True), "stream_interval": ANY, "beam_width": (None, 1),
            "watermark": _NULL, "custom_params": _NULL}


# fields every route shares (routing, scheduling hints, metrics, unsupported features)
_SHARED = {
    **dict.fromkeys(("routed_dp_rank", "data_parallel_rank", "disagg_prefill_dp_rank", "session_id",
                     "priority", "extra_key", "custom_labels"), ANY),
    **dict.fromkeys(("bootstrap_host", "bootstrap_port", "bootstrap_room", "lora_path", "session_params",
                     "custom_logit_processor", "watermark", "images_config", "mm_processor_kwargs",
                     "cache_salt"), _NULL),
    **dict.fromkeys(("return_hidden_states", "return_routed_experts"), _FALSE),
    "routed_experts_start_len": (None, 0),
}  # fmt: skip

GENERATE = {
    **_SHARED,
    **dict.fromkeys(("log_metrics", "routing_key", "conversation_id", "http_worker_ipc", "no_logs",
                     "external_trace_header", "received_time", "modalities"), ANY),
    "model": ANY,  # sglang-router forwards its routing key ("model": null) with every /generate
    **dict.fromkeys(("input_embeds", "image_data", "video_data", "audio_data", "mm_hashes", "mm_content_hashes",
                     "video_config", "sampling_logprobs_mode", "lora_id",
                     "positional_embed_overrides", "bootstrap_pair_key", "decode_tp_size", "max_thinking_tokens",
                     "need_wait_for_mm_inputs", "num_items_assigned", "encoder_urls", "max_dynamic_patch",
                     "min_dynamic_patch", "image_max_dynamic_patch", "video_max_dynamic_patch",
                     "multi_item_delimiter_indices", "token_indices_to_pool", "kv_hints"), _NULL),
    **dict.fromkeys(("use_audio_in_video", "return_sampling_mask", "return_flat_raw_top_logprobs",
                     "return_flat_raw_output_top_logprobs", "return_flat_raw_top_logprobs_b64",
                     "return_indexer_topk", "background", "require_reasoning", "return_bytes", "return_entropy",
                     "return_prompt_token_ids"), _FALSE),
}  # fmt: skip

_OPENAI = {
    **_SHARED,
    "user": str,
    "spaces_between_special_tokens": SAMPLING["spaces_between_special_tokens"],
    "custom_params": SAMPLING["custom_params"],
    **dict.fromkeys(("return_cached_tokens_details", "return_spec_tokens_details", "return_token_ids"), _FALSE),
    # OpenAI fields that only concern OpenAI's own service
    "service_tier": str, "store": bool, "metadata": dict,
}

COMPLETION = {**_OPENAI, "best_of": (None, 1)}

CHAT = {
    **_OPENAI,
    **dict.fromkeys(("parallel_tool_calls", "return_flat_raw_top_logprobs_b64"), ANY),
    **dict.fromkeys(("thinking", "task", "sampling_logprobs_mode", "max_dynamic_patch", "min_dynamic_patch",
                     "video_config", "input_ids"), _NULL),
    **dict.fromkeys(("return_prompt_token_ids", "return_meta_info", "return_input_ids_in_sglext",
                     "return_output_ids_in_sglext", "return_sampling_mask", "return_flat_raw_output_top_logprobs",
                     "use_audio_in_video"), _FALSE),
}  # fmt: skip


def check_fields(body: dict, supported: set, extras: dict, route: str) -> None:
    """Raise RadixflowError for a field that is neither supported nor an inert SGLang field."""
    unknown = sorted(k for k in body if k not in supported and k not in extras)
    if unknown:
        raise RadixflowError(
            f"unknown field(s) for {route}: {', '.join(unknown)}; accepted: {', '.join(sorted(supported))} "
            "(and SGLang's fields at values that change nothing)"
        )
    for name, value in body.items():
        if name in supported:
            continue
        if isinstance(extras[name], type):
            if value is not None and not isinstance(value, extras[name]):
                raise RadixflowError(f"{name} must be {_TYPE_NAMES[extras[name]]} or null, got {value!r}")
        elif not _inert(value, extras[name]):
            offs = " or ".join("null" if v is None else str(v).lower() for v in extras[name])
            raise RadixflowError(f"{name}={value!r} is not supported by radixflow; remove it or set it to {offs}")


_TYPE_NAMES = {str: "a string", bool: "true or false", dict: "an object"}


def _inert(value: Any, offs: Any) -> bool:
    if offs is ANY or value in ([], {}):
        return True
    if isinstance(value, list):
        return all(_inert(v, offs) for v in value)
    return any(value is v or (type(value) is type(v) and value == v) for v in offs)
