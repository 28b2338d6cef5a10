"""`forerun bench scaleout`'s exit codes when launching its workers fails: usage (2) only for what the user can fix
(smg missing, LaunchError code 2), a failure (1) when a worker process dies while starting."""

from __future__ import annotations

import pytest

from forerun.cli.main import main
from forerun.eval.presto import scaleout
from forerun.runtime_ext.launch import LaunchError


@pytest.mark.parametrize("code, expected", [(1, 1), (2, 2)])
def test_a_launch_failure_keeps_its_exit_class(monkeypatch, capsys, code, expected):
    def failing(cfg, logs, progress=None):
        raise LaunchError("http://127.0.0.1:1: the process exited before becoming healthy; last lines:\nTraceback", code)

    monkeypatch.setattr(scaleout, "run_scaleout", failing)
    assert main(["bench", "scaleout", "--workers", "1"]) == expected
    err = capsys.readouterr().err.strip()
    assert err == "forerun bench scaleout: http://127.0.0.1:1: the process exited before becoming healthy; last lines:"
