"""Ctrl-C: `forerun: interrupted` on one line, exit 130, no thread tracebacks, and whole JSONL lines only.

The real entry point runs in a subprocess and gets SIGINT in the middle of a long run (the engine worker,
SGLang's fork threads and a progress bar are all live then).
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable


class Running:
    """A started `forerun` process whose stderr is collected by a thread."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.err = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while chunk := self.proc.stderr.read1(4096):
            self.err.extend(chunk)

    def wait_for(self, ready: Callable[[], bool], timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            assert self.proc.poll() is None, f"exited early ({self.proc.returncode}): {bytes(self.err)!r}"
            assert time.monotonic() < deadline, f"not ready in {timeout} s: {bytes(self.err)[-500:]!r}"
            time.sleep(0.1)

    def interrupt(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout=120)
        self._reader.join(timeout=10)
        return code, bytes(self.err).decode("utf-8", "replace")


def assert_interrupted(code: int, err: str) -> None:
    assert code == 130, err
    assert "Traceback" not in err and "Exception" not in err, err
    assert err.count("\n") == 1 and err.split("\r")[-1] == "forerun: interrupted\n", repr(err)


def test_sigint_during_bench_presto_leaves_whole_jsonl_lines(tmp_path: Path, forerun_argv):
    records = tmp_path / "nodes.jsonl"
    run = Running(forerun_argv + ["bench", "presto", "--model", "tiny", "--prompts", "3", "--n", "8", "--K", "400",
                                  "--npf", "8", "--samplers", "power-mh", "entropy-cut", "--records", str(records)])
    run.wait_for(lambda: records.exists() and records.stat().st_size > 0)  # a chain finished and wrote its nodes
    time.sleep(0.5)  # now inside a later chain
    code, err = run.interrupt()
    assert_interrupted(code, err)
    text = records.read_text()
    assert text.endswith("\n")
    lines = text.splitlines()
    assert lines and all(json.loads(line)["model"] == "tiny" for line in lines)


def test_sigint_during_sample_prints_one_line(forerun_argv):
    run = Running(forerun_argv + ["sample", "--model", "tiny", "--prompt", "hi", "--n", "8", "--K", "1000000000",
                                  "--presto", "--npf", "8"])
    run.wait_for(lambda: b"transition" in run.err)  # the progress bar over MH transitions is running
    time.sleep(0.5)
    assert_interrupted(*run.interrupt())


def test_a_ctrl_c_while_the_command_line_starts_is_one_line_too():
    """The command modules import for a second or more (torch) before any command's handler runs: a Ctrl-C then
    printed a KeyboardInterrupt traceback from an import.  `interrupt_exits` guards that stretch in cli/main.py."""
    import sys

    code = ("import os, signal, time\nfrom forerun.cli.errors import interrupt_exits\nwith interrupt_exits():\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(30)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert proc.returncode == 130 and proc.stderr.decode().strip() == "forerun: interrupted"
    main_py = (Path(__file__).parents[2] / "cli" / "main.py").read_text()
    guarded = main_py.split("with interrupt_exits():", 1)[1].split("\n\n", 1)[0]
    assert "from . import" in guarded  # the command modules import inside it


def test_a_closed_stdout_ends_quietly_and_a_full_disk_is_a_failure(tmp_path):
    """A pipe reader that went away is not bad input (it was exit 2 with '[Errno 32] Broken pipe'); a write the
    system refuses is a failure (exit 1), not usage (exit 2)."""
    import errno
    import sys

    from forerun.cli.errors import EXIT_FAILURE, EXIT_USAGE, exit_code_for

    pipe = subprocess.run(f"set -o pipefail; {sys.executable} -m forerun.cli.main generate --model tiny --prompt hi "
                          "--max-tokens 4 --json | head -c 0", shell=True, capture_output=True, timeout=120,
                          executable="/bin/bash")
    assert pipe.returncode == EXIT_FAILURE and pipe.stderr == b""
    assert exit_code_for(OSError(errno.ENOSPC, "No space left on device")) == EXIT_FAILURE
    assert exit_code_for(FileNotFoundError(errno.ENOENT, "nope")) == EXIT_USAGE


def _children(pid: int, marker: str) -> list[int]:
    """Processes whose parent is `pid` and whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and marker in cmd:
            found.append(int(entry.name))
    return found


def _gone(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_sigterm_during_sample_is_one_line_and_exit_143(forerun_argv):
    run = Running(forerun_argv + ["sample", "--model", "tiny", "--prompt", "hi", "--n", "8", "--K", "1000000000",
                                  "--presto", "--npf", "8"])
    run.wait_for(lambda: b"transition" in run.err)
    run.proc.send_signal(signal.SIGTERM)
    code = run.proc.wait(timeout=120)
    run._reader.join(timeout=10)
    err = bytes(run.err).decode("utf-8", "replace")
    assert code == 143 and "Traceback" not in err, err
    assert err.count("\n") == 1 and err.split("\r")[-1] == "forerun: terminated\n", repr(err)


def test_sigterm_during_bench_scaleout_stops_the_workers_it_launched(forerun_argv):
    """A SIGTERM (a scheduler's, `timeout`'s) ended the process at once: the stand-in workers it had started in
    sessions of their own kept running.  Now the command unwinds as on Ctrl-C and stops them."""
    from forerun.eval.presto.scaleout import STANDIN_SERVER

    run = Running(forerun_argv + ["bench", "scaleout", "--workers", "1", "--no-gateway", "--prompts", "8",
                                  "--K", "100000", "--quiet"])
    workers: list[int] = []

    def started() -> bool:
        workers[:] = _children(run.proc.pid, STANDIN_SERVER)
        return bool(workers)

    run.wait_for(started)
    time.sleep(1.0)  # the worker answers; the chains run
    run.proc.send_signal(signal.SIGTERM)
    code = run.proc.wait(timeout=120)
    run._reader.join(timeout=10)
    err = bytes(run.err).decode("utf-8", "replace")
    assert code == 143, err
    deadline = time.monotonic() + 15
    while not all(_gone(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(_gone(pid) for pid in workers), f"workers still running: {workers}"


def test_an_unwind_that_hangs_after_sigterm_still_ends_the_process():
    """A `finally` block that never returns (a thread that will not join) kept the process alive after SIGTERM; the
    unwind is bounded (UNWIND_LIMIT_S), then the process leaves with the same line and code."""
    import sys

    code = ("import os, signal, threading, time\nfrom forerun.cli import errors\nerrors.UNWIND_LIMIT_S = 1.0\n"
            "def handler():\n    try:\n        os.kill(os.getpid(), signal.SIGTERM)\n        time.sleep(30)\n"
            "    finally:\n        threading.Event().wait(60)\n"
            "errors.run_guarded('x', handler)\n")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 143 and err.split("\r")[-1] == "forerun: terminated\n", err
    assert time.monotonic() - start < 30
