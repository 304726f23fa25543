"""radixflow: a serving system for LLM programs."""

from radixflow.errors import ModelPathError, RadixflowError
from radixflow.runtime.server_args import ServerArgs

__version__ = "0.1.0"


def __getattr__(name):  # heavy imports (torch, transformers) only when used
    if name == "Engine":
        from radixflow.runtime.engine import Engine

        return Engine
    raise AttributeError(f"module 'radixflow' has no attribute {name!r}")


__all__ = ["Engine", "ServerArgs", "RadixflowError", "ModelPathError"]
