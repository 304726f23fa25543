"""Triton kernel variants compiled in this process, per radixflow kernel: a round that compiles one pays
the compile (0.3-1 s on a bare machine) inside a forward pass, which the pass timer counts as GPU busy.
Triton compiles a variant per set of constexprs and per specialization of its integer arguments (equal
to 1, divisible by 16), so a pass shape first seen late in a run compiles then."""

from __future__ import annotations

import sys


def _jit_functions() -> dict:
    try:
        from triton.runtime.autotuner import Autotuner
        from triton.runtime.jit import JITFunction
    except ImportError:  # no Triton: nothing compiles
        return {}
    found = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("radixflow.kernels") or module is None:
            continue
        for attr, value in vars(module).items():
            fn = value.fn if isinstance(value, Autotuner) else value
            if isinstance(fn, JITFunction):
                found[f"{name.rsplit('.', 1)[-1]}.{attr}"] = fn
    return found


def _variants(fn) -> int:
    return sum(len(entry[0]) for entry in fn.device_caches.values())  # device -> (kernel cache, ...): Triton 3.2 on


def compiled_variants() -> dict[str, int]:
    """Variants compiled so far, per kernel (module.function) of radixflow.kernels."""
    return {name: _variants(fn) for name, fn in _jit_functions().items()}


def new_variants(before: dict[str, int]) -> dict[str, int]:
    """Kernels that compiled variants since `before` (compiled_variants()), and how many."""
    return {k: n - before.get(k, 0) for k, n in compiled_variants().items() if n > before.get(k, 0)}
