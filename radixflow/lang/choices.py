"""Choice-scoring methods for `select` (the scoring itself runs next to the model:
runtime/programs/choice_scoring.py), exposed as objects like SGLang's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from radixflow.errors import RadixflowError
from radixflow.runtime.programs.choice_scoring import METHODS


@dataclass(frozen=True)
class ChoicesMethod:
    name: str


token_length_normalized = ChoicesMethod("token_length_normalized")
greedy_token_selection = ChoicesMethod("greedy_token_selection")
unconditional_likelihood_normalized = ChoicesMethod("unconditional_likelihood_normalized")


def method_name(method: Optional[Union[ChoicesMethod, str]]) -> str:
    if method is None:
        return token_length_normalized.name
    name = method.name if isinstance(method, ChoicesMethod) else method
    if name not in METHODS:
        raise RadixflowError(f"unknown choices method {name!r}; use one of {', '.join(METHODS)}")
    return name
