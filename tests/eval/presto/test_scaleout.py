"""`bench scaleout`'s reading of the stand-in workers' routing counters when a worker has died mid-run."""

from __future__ import annotations

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
