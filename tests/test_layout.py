"""The layout rules of the renovation: small modules and functions, test doubles out of production code,
and package-internal imports that a reader can follow by path."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = ("forerun_pkg", "programs", "runtime_ext", "classifiers", "eval", "cli", "testing")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(p for folder in PACKAGE_FOLDERS for p in (REPO / folder).rglob("*.py"))


def test_no_module_over_500_lines():
    long = [f"{p.relative_to(REPO)}: {n}" for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, "modules over 500 lines:\n" + "\n".join(long)


def test_no_function_over_60_lines():
    long = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {n} lines")
    assert not long, "functions over 60 lines:\n" + "\n".join(long)


def test_production_code_never_imports_the_test_doubles():
    pattern = re.compile(r"^\s*(from\s+(forerun\.testing|\.+testing)\b|import\s+forerun\.testing\b)", re.M)
    offenders = [str(p.relative_to(REPO)) for p in _modules()
                 if not p.is_relative_to(REPO / "testing") and pattern.search(p.read_text())]
    assert not offenders, f"production modules import forerun.testing: {offenders}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_package_imports_are_relative_and_resolve_by_path(path):
    """`from forerun.x import ...` inside the package hides the arrow from a static reader (forerun.x maps
    to a folder through package-dir); relative imports name sibling folders, so they resolve by path."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("forerun"):
            pytest.fail(f"{path.relative_to(REPO)}:{node.lineno}: absolute import of {node.module}")
        if isinstance(node, ast.Import) and any(a.name.startswith("forerun") for a in node.names):
            pytest.fail(f"{path.relative_to(REPO)}:{node.lineno}: absolute import of forerun")
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
            target = base.joinpath(*(node.module or "").split(".")) if node.module else base
            names = [a.name for a in node.names]
            found = target.with_suffix(".py").is_file() or (target / "__init__.py").is_file() or \
                all((target / f"{n}.py").is_file() or (target / n / "__init__.py").is_file() for n in names)
            assert found, f"{path.relative_to(REPO)}:{node.lineno}: relative import {'.' * node.level}{node.module} " \
                          f"does not resolve to a file by path"


# -- the import graph ------------------------------------------------------------------------------------------
LAYERS = ("forerun_pkg", "runtime_ext", "programs", "classifiers", "eval", "cli", "testing")
"""Bottom to top: a module imports only from its own folder or from folders listed before it (cli and testing
are both top floors: neither imports the other)."""


def _dotted(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (top-level, function-level and TYPE_CHECKING imports alike)."""
    mods = {_dotted(p): p for p in _modules()}
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level > 0):
                continue
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
            submodules = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
            out.update(submodules if node.module is None and submodules else
                       [t for t in (target, *submodules) if t in mods])
        graph[name] = out - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _node(module: str, packages: set[str]) -> str:
    """A module's place in the folder graph: its sub-package (e.g. eval.harness), or itself for a module that
    sits directly in a top folder (runtime_ext.protocol)."""
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        if ".".join(parts[:n]) in packages and n >= 2 and ".".join(parts[:n]) != module:
            return ".".join(parts[:n])
    return module if module in packages and len(parts) >= 2 else ".".join(parts[:2]) if len(parts) > 1 else module


def test_no_import_circles_between_modules():
    assert _cycles(import_graph()) == []


def test_folders_form_a_dag_and_arrows_point_down():
    graph = import_graph()
    packages = {_dotted(p.parent / "__init__.py") for p in _modules() if p.name == "__init__.py"}
    folders: dict[str, set[str]] = {}
    for src, targets in graph.items():
        for dst in targets:
            a, b = _node(src, packages), _node(dst, packages)
            if a != b and not b.startswith(a + ".") and not a.startswith(b + "."):
                folders.setdefault(a, set()).add(b)
            top_a, top_b = src.split(".")[0], dst.split(".")[0]
            assert LAYERS.index(top_b) <= LAYERS.index(top_a) and not {top_a, top_b} == {"cli", "testing"}, \
                f"{src} imports {dst}: an arrow up ({top_a} -> {top_b})"
    assert _cycles(folders) == [], "folders that import each other"


def test_no_private_name_imported_across_modules():
    offenders = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                offenders += [f"{path.relative_to(REPO)}:{node.lineno} {a.name}" for a in node.names
                              if a.name.startswith("_")]
    assert not offenders, "private names imported across modules:\n" + "\n".join(offenders)
