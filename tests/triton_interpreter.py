"""A test-time speed-up for Triton's CPU interpreter (TRITON_INTERPRET=1), installed by conftest.py.

A launch (interpreter.GridExecutor) patches triton.language's builtins for the interpreter and undoes that at its end.
Every call of one @triton.jit function from another (InterpretedFunction.__call__) patches them all again, by
inspect.getmembers over tl, tl.tensor and tl.math, and never undoes it: the same modules, already patched. In the
sampling kernel's tests that was ~40% of the interpreted time (py-spy). This skips the repeat while a launch's patch
stands: a device function is patched for only where its module holds a language module (tl or tl.core) that this
launch has not patched yet (tl.max's module holds tl.core), as the interpreter itself picks them. A miss would leave
builtins unpatched, and their calls fail loudly ("_semantic argument must be provided"), not compute something else.
"""

from __future__ import annotations


def skip_repeated_language_patching() -> None:
    import triton.language as tl
    from triton.runtime import interpreter

    original_patch, original_launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    state: dict = {"patched": None}  # the language modules (tl, tl.core) the current launch has patched
    langs_of: dict = {}

    def patch_lang(fn):
        if fn not in langs_of:  # as _patch_lang picks them: tl.max's module (standard) holds tl.core, not tl
            langs_of[fn] = frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)
        if state["patched"] is not None and langs_of[fn] <= state["patched"]:
            return None  # a device function whose modules this launch patched; InterpretedFunction drops the scope
        scope = original_patch(fn)
        state["patched"] = (state["patched"] or frozenset()) | langs_of[fn]
        return scope

    def launch(self, *args, **kwargs):
        try:
            return original_launch(self, *args, **kwargs)
        finally:
            state["patched"] = None

    interpreter._patch_lang = patch_lang
    interpreter.GridExecutor.__call__ = launch
