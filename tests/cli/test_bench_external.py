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


def test_a_worker_count_past_the_limit_is_refused_before_any_launch(monkeypatch, capsys):
    """Was: `--workers 100000 --no-gateway` launched a worker, then its consecutive ports overflowed: internal error."""
    launched = []
    monkeypatch.setattr(scaleout, "run_scaleout", lambda *a, **k: launched.append(a))
    assert main(["bench", "scaleout", "--workers", "1", "100000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--workers: each count must be in [1, " in err and not launched


def test_more_prompts_than_math500_holds_is_refused_before_any_launch(monkeypatch, capsys):
    """Was: `--prompts 100000` ran every prompt there was (500) and reported the run as asked; `bench presto`
    refuses the same request."""
    launched = []
    monkeypatch.setattr(scaleout, "run_scaleout", lambda *a, **k: launched.append(a))
    assert main(["bench", "scaleout", "--prompts", "100000", "--no-gateway"]) == 2
    err = capsys.readouterr().err  # "math500 has only 500 prompts here, ..." (the packaged slice: its own refusal)
    assert err.count("\n") == 1 and "asked for 100000" in err and not launched
