"""No import cycle among the suite's modules, imports inside functions included: a module is read as its imports,
and the graph of them over suite/, analysis/ and launchers/ has no cycle. In particular the sweep records a
prediction it is handed and never imports the predictor, which plans points and may import the sweep's planning."""

import ast
from pathlib import Path

from suite.paths import REPO_ROOT

PACKAGES = ("suite", "analysis", "launchers")


def module_files() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (REPO_ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


def imported(tree: ast.AST, modules: dict[str, Path]) -> set[str]:
    """The suite's modules `tree` imports: `from a.b import c` is module a.b.c where there is one, else a.b."""
    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return {found for found in map(known, names) if found}


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imported(ast.parse(path.read_text()), modules) - {name} for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_the_detector_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back():
    assert cycles(import_graph()) == []


def test_the_sweep_never_imports_the_predictor():
    graph = import_graph()
    sweep = {name: deps for name, deps in graph.items() if name.startswith("suite.sweep")}
    assert sweep and not {dep for deps in sweep.values() for dep in deps if dep.startswith("suite.predict")}
    predictor = {dep for name, deps in graph.items() if name.startswith("suite.predict") for dep in deps}
    assert "suite.sweep.driver" not in predictor and "suite.sweep.jobs" not in predictor
