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
