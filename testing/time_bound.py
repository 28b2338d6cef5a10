"""Running a snippet in a fresh interpreter that must finish within a time bound: how tests catch a pathological
input that takes super-linear time (regular-expression backtracking, quadratic rescans) without hanging the suite."""

from __future__ import annotations

import subprocess
import sys

import pytest


def stdout_within(code: str, seconds: float, what: str) -> str:
    """The stdout of `python -c code`; the test fails when it runs past `seconds` (naming `what`) or exits non-zero."""
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} did not end within {seconds:g} s")
    assert out.returncode == 0, out.stderr
    return out.stdout
