"""Run the real `forerun` entry point in a subprocess (fixtures shared by the CLI tests)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest


def forerun_command() -> list[str]:
    script = Path(sys.executable).with_name("forerun")
    if script.is_file():
        return [str(script)]
    found = shutil.which("forerun")
    return [found] if found else [sys.executable, "-m", "forerun.cli.main"]


def _run(argv: list[str], *, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the entry point; stdout/stderr decoded without newline translation (a progress bar's "\\r"
    frames stay "\\r", so a line is what ends in "\\n")."""
    env = {**os.environ, "FORERUN_TRACEBACK": ""}
    proc = subprocess.run(forerun_command() + argv, capture_output=True, timeout=timeout, env=env, cwd=cwd)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode("utf-8", "replace"),
                                       proc.stderr.decode("utf-8", "replace"))


def _assert_one_line_error(proc: subprocess.CompletedProcess, needle: str, code: int | None = None) -> None:
    err = proc.stderr
    assert proc.returncode != 0, f"exit 0; stdout: {proc.stdout[-500:]}"
    if code is not None:
        assert proc.returncode == code, err
    assert "Traceback" not in err, err
    assert err.endswith("\n") and err.count("\n") == 1, f"not exactly one line on stderr:\n{err!r}"
    assert err.split("\r")[-1].startswith("forerun"), err  # after a progress bar that cleared itself
    assert needle in err, f"{needle!r} not in {err!r}"


@pytest.fixture(scope="session")
def run_forerun() -> Callable[..., subprocess.CompletedProcess]:
    return _run


@pytest.fixture(scope="session")
def assert_one_line_error() -> Callable[..., None]:
    return _assert_one_line_error


@pytest.fixture(scope="session")
def forerun_argv() -> list[str]:
    """The command line that starts the entry point (for tests that drive the process themselves)."""
    return forerun_command()
