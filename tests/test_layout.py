"""The package layout stays what docs/architecture.md promises: imports only go down
(lang -> runtime -> radix_cache / constrained / kernels -> the modules at the package's root), no module imports
itself back through others (lazy imports inside functions count too), and no module is over
400 lines. Read from the source with `ast`: nothing is imported."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "radixflow"
MAX_LINES = 400
# Higher imports lower. The package root (`radixflow`, `radixflow.__main__`) is the public facade
# over everything; the other modules at the root (errors, env, model files, ...) sit under every package.
RANKS = {
    "radixflow": 4,
    "radixflow.__main__": 4,
    "radixflow.lang": 3,
    "radixflow.runtime": 2,
    "radixflow.radix_cache": 1,
    "radixflow.constrained": 1,
    "radixflow.kernels": 1,
    "radixflow.errors": 0,
    "radixflow.host_copy": 0,
    "radixflow.env": 0,
    "radixflow.version": 0,
    "radixflow.model_files": 0.5,  # finds model files; reads errors and env
}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _type_checking_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and getattr(test, "id", getattr(test, "attr", None)) == "TYPE_CHECKING"


def _imported_names(path: pathlib.Path, module: str, modules: dict) -> set[str]:
    """Every radixflow module `path` imports, at the top or inside a function. `from pkg import mod`
    imports mod (pkg/__init__ runs for any import below it, so it is no edge of its own);
    `from pkg import name` imports pkg."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    stack: list[ast.AST] = [ast.parse(path.read_text())]
    while stack:
        node = stack.pop()
        if _type_checking_only(node):
            continue
        stack.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                names.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
    return names


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: {n for n in _imported_names(p, m, modules) if n in modules and n != m} for m, p in modules.items()}


def _owner(module: str) -> str:
    """The RANKS entry a module belongs to."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in RANKS:
            return ".".join(parts[:n])
    raise AssertionError(f"{module} belongs to no package in RANKS; add its package there")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        component.append(m)
                        if m == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "modules that import each other (through lazy imports too): " + "; ".join(
        " <-> ".join(c) for c in cycles
    )


def test_imports_only_go_down():
    upward = []
    for module, imported in _graph().items():
        a = _owner(module)
        for target in imported:
            b = _owner(target)
            if a != b and RANKS[b] >= RANKS[a]:
                upward.append(f"{module} -> {target}")
    assert not upward, "imports that go up or sideways between packages: " + ", ".join(sorted(upward))


def test_no_module_over_400_lines():
    long = {m: n for m, p in _modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them): {long}"
