"""Tokenizer loading, EOS ids and the chat template."""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from radixflow.errors import RadixflowError


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def eos_token_ids(path: str, config, tokenizer) -> set[int]:
    """EOS ids from the config, the generation config and the tokenizer, together."""
    ids: set[int] = set()

    def add(v):
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids.update(int(x) for x in v)

    add(getattr(config, "eos_token_id", None))
    gen_path = os.path.join(path, "generation_config.json")
    if os.path.isfile(gen_path):
        with open(gen_path) as f:
            add(json.load(f).get("eos_token_id"))
    add(tokenizer.eos_token_id)
    return ids


def apply_chat_template(
    tokenizer, messages: list, add_generation_prompt: bool = True, tools: Optional[list] = None, **kwargs: Any
) -> str:
    """`kwargs`: continue_final_message and the template's own variables (chat_template_kwargs)."""
    if not tokenizer.chat_template:
        raise RadixflowError("this model has no chat template; use the completion API with a plain prompt")
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, tools=tools, **kwargs
    )
