"""Run the `forerun` entry point: the real one in a subprocess (`run_forerun`), or its `main(argv)` in this
process (`run_forerun_in_process`, same result object) where a process of its own is not the point.  A
command that loads a model pays torch's and transformers' imports (~5-9 s of CPU) in a subprocess; in
process they and the compiled kernels are paid once per test worker.  Each guarantee that needs a real
process (exit status, one line on stderr up to interpreter exit, strict JSON on stdout, SIGINT) keeps
real-subprocess cases."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from forerun.cli.errors import TRACEBACK_ENV
from forerun.cli.main import main


def forerun_command() -> list[str]:
    script = Path(sys.executable).with_name("forerun")
    if script.is_file():
        return [str(script)]
    found = shutil.which("forerun")
    return [found] if found else [sys.executable, "-m", "forerun.cli.main"]


def _run(argv: list[str], *, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the entry point; stdout/stderr decoded without newline translation (a progress bar's "\\r"
    frames stay "\\r", so a line is what ends in "\\n")."""
    env = {**os.environ, TRACEBACK_ENV: ""}
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


@pytest.fixture
def run_forerun_in_process(capfd, monkeypatch) -> Callable[..., subprocess.CompletedProcess]:
    """`main(argv)` here, with stdout/stderr captured at the file descriptors (what C code and other threads
    write too) and a SystemExit (argparse's usage errors) turned into the exit status, as `_run` reports it.
    An exception that escapes `main` fails the test: in a subprocess it would have been a traceback."""
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)

    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess:
        capfd.readouterr()
        try:
            code = main(argv)
        except SystemExit as exc:
            if isinstance(exc.code, str):  # sys.exit("message"): the interpreter would print it, exit 1
                print(exc.code, file=sys.stderr)
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = capfd.readouterr()
        return subprocess.CompletedProcess(["forerun", *argv], code, out, err)

    return run
