"""SGLang 0.5.23's own frontend test programs (sglang/test/test_programs.py), loaded
unchanged except that `import sglang as sgl` becomes `import radixflow as sgl`."""

from __future__ import annotations

import importlib.util
import inspect
import os
import types

ARGS = {"test_select": {"check_answer": False}}  # what SGLang's own runner passes


def source_path() -> str:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.origin, "sglang is not installed"
    return os.path.join(os.path.dirname(spec.origin), "test", "test_programs.py")


def load() -> types.ModuleType:
    with open(source_path()) as f:
        src = f.read()
    assert src.count("import sglang as sgl") == 2, "test_programs.py changed upstream"
    mod = types.ModuleType("sglang_test_programs_on_radixflow")
    mod.__file__ = source_path()
    exec(compile(src.replace("import sglang as sgl", "import radixflow as sgl"), mod.__file__, "exec"), mod.__dict__)
    return mod


def programs(mod: types.ModuleType) -> list[str]:
    return [n for n, f in vars(mod).items() if n.startswith("test_") and inspect.isfunction(f)]


def run_all(names: list[str] | None = None) -> dict:
    """{program: "pass" | "<error>"} on the default backend already set."""
    mod = load()
    out = {}
    for name in names or programs(mod):
        try:
            getattr(mod, name)(**ARGS.get(name, {}))
            out[name] = "pass"
        except Exception as e:  # report every program, not only the first failure
            out[name] = f"{type(e).__name__}: {str(e).strip()[:200]}"
    return out


if __name__ == "__main__":  # the whole file against an in-process Engine: python tests/sglang_programs.py
    import radixflow as rf

    with rf.Engine() as engine:
        rf.set_default_backend(engine)
        results = run_all()
    for name, res in results.items():
        print(f"{name}: {res}")
    print(f"{sum(r == 'pass' for r in results.values())} of {len(results)} pass")
