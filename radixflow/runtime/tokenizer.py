"""The chat template (loading a tokenizer and its EOS ids: radixflow/model_files.py)."""

from __future__ import annotations

from typing import Any, Optional

from radixflow.errors import RadixflowError


def apply_chat_template(
    tokenizer, messages: list, add_generation_prompt: bool = True, tools: Optional[list] = None, **kwargs: Any
) -> str:
    """`kwargs`: continue_final_message and the template's own variables (chat_template_kwargs)."""
    if not tokenizer.chat_template:
        raise RadixflowError("this model has no chat template; use the completion API with a plain prompt")
    import jinja2

    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, tools=tools, **kwargs
        )
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        # the template runs on the request's messages and chat_template_kwargs: what it cannot render is theirs
        raise RadixflowError(f"the chat template could not render this request ({type(e).__name__}: {e}); "
                             "check the messages and chat_template_kwargs") from None
