"""Where programs run: an in-process Engine, a radixflow server (RuntimeEndpoint,
Runtime), or an OpenAI-compatible server (OpenAIEndpoint)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

if TYPE_CHECKING:
    from radixflow.lang.backends.base import Backend
    from radixflow.lang.backends.runtime import Runtime

_default = None


def set_default_backend(backend) -> None:
    global _default
    _default = backend


def get_default_backend():
    return _default


def resolve_backend(backend=None):
    """A Backend for `backend` (None: the default); an Engine is wrapped."""
    from radixflow.errors import RadixflowError

    b = backend if backend is not None else _default
    if b is None:
        raise RadixflowError("no backend: pass backend=... or call rf.set_default_backend(...) first")
    if getattr(b, "is_program_backend", False):
        return b
    if hasattr(b, "run_program") and hasattr(b, "scheduler"):
        from radixflow.lang.backends.engine_backend import EngineBackend

        return EngineBackend.for_engine(b)
    if hasattr(b, "endpoint"):  # a Runtime
        return b.endpoint
    raise RadixflowError(f"not a backend: {type(b).__name__}; use an Engine, Runtime, RuntimeEndpoint or OpenAIEndpoint")


class GlobalConfig:
    """SGLang's `sgl.global_config`, as far as programs read it: the default backend."""

    @property
    def default_backend(self) -> Optional[Union["Backend", "Runtime"]]:
        """What set_default_backend got (a Runtime keeps its `.endpoint`, as in SGLang), but an
        Engine's program backend in place of the Engine (it has `token_usage`)."""
        if _default is None or hasattr(_default, "endpoint") or getattr(_default, "is_program_backend", False):
            return _default
        return resolve_backend(_default)


global_config = GlobalConfig()


def flush_cache(backend=None) -> bool:
    return resolve_backend(backend).flush_cache()


def get_server_info(backend=None) -> Optional[dict]:
    return resolve_backend(backend).get_server_info()
