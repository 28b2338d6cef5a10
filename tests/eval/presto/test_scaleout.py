"""`bench scaleout`'s reading of the stand-in workers' routing counters when a worker has died mid-run."""

from __future__ import annotations

import socket

import pytest

from forerun.cli.errors import EXIT_FAILURE, exit_code_for
from forerun.eval.presto import scaleout
from forerun.runtime_ext.launch import free_port


def test_a_worker_that_died_mid_run_is_a_failure_naming_it():
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: the worker's process is gone
    with pytest.raises(Exception) as info:
        scaleout._routing_counts(dead)
    # a failure (exit 1) that names the worker, not the bare "<urlopen error ...>" of a usage error (exit 2)
    assert exit_code_for(info.value) == EXIT_FAILURE
    assert dead in str(info.value) and "died" in str(info.value)


def test_the_ports_of_a_launch_are_all_free(monkeypatch, tmp_path):
    """The gateway takes port P and the workers P+1.. (without it P..): when P is free but P+1 is taken, another P
    is chosen instead of a launch failing with 'pick another --port' (an option bench scaleout lacks)."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    busy = taken.getsockname()[1]
    offered = iter([busy - 1, scaleout.launcher.free_port()])
    monkeypatch.setattr(scaleout.launcher, "free_port", lambda host="127.0.0.1": next(offered))
    seen = {}
    monkeypatch.setattr(scaleout.launcher, "launch", lambda args, extra, module=None: seen.setdefault("args", args))
    try:
        scaleout._launch(scaleout.ScaleoutConfig(), 2, True, 0.0, str(tmp_path))
    finally:
        taken.close()
    first = seen["args"].port
    assert busy not in range(first, first + 3)
