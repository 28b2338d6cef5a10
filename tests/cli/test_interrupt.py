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
