"""The four namespaces of the `forerun` distribution import, and the packaged dataset slices ship."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_namespaces_import_in_a_fresh_interpreter(tmp_path):
    # run outside the checkout so the installed distribution (editable or regular) is what imports
    res = subprocess.run(
        [sys.executable, "-c", "import forerun.programs, forerun.runtime_ext, forerun.classifiers, forerun.eval, forerun.cli"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]


def test_package_data_declared_for_dataset_slices():
    import tomllib

    cfg = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools = cfg["tool"]["setuptools"]
    data = setuptools["package-data"]["forerun.eval.datasets.data"]
    assert "*.jsonl" in data and "*.md" in data
    assert "forerun.eval.datasets.data" in setuptools["packages"]
    assert setuptools["package-dir"]["forerun.eval"] == "eval"


def test_packaged_slices_present_and_never_gpqa_or_lcb():
    import importlib.resources

    data = importlib.resources.files("forerun.eval.datasets") / "data"
    names = {p.name for p in data.iterdir()}
    assert "PROVENANCE.md" in names
    for name in ("math500.jsonl", "humaneval.jsonl", "mbpp.jsonl", "mmlu.jsonl", "aime2024.jsonl", "aime2025.jsonl"):
        assert name in names, name
    assert not any("gpqa" in n.lower() or "lcb" in n.lower() or "livecode" in n.lower() for n in names)
