"""`forerun bench work-split`: pairs alternate their order, the summary is the paired comparison, the kernels'
setting is restored, and the neighbour process ends with the block."""

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from forerun.eval.engine_bench import work_split
from forerun.eval.engine_bench.work_split import WorkSplitConfig, neighbour, paired_summary


def test_paired_summary_compares_the_same_repetitions():
    s = paired_summary([0.030, 0.040, 0.020], [0.029, 0.036, 0.021])
    assert s["static_step_s"] == 0.030 and s["stealing_step_s"] == 0.029
    assert s["median_paired_difference_s"] == pytest.approx(-0.001)  # differences -0.001, -0.004, +0.001
    assert s["static_over_stealing"] == pytest.approx(0.030 / 0.029)
    assert (s["stealing_faster_in"], s["pairs"]) == (2, 3)


@pytest.mark.parametrize("bad", [dict(rows=()), dict(rows=(0,)), dict(repeats=0), dict(tokens=0),
                                 dict(neighbour_duties=()), dict(neighbour_duties=(1.0,)),
                                 dict(neighbour_duties=(-0.1,)), dict(neighbour_duties=(float("nan"),))])
def test_config_is_validated(bad):
    with pytest.raises(ValueError):
        WorkSplitConfig(**bad)


class FakeKernels:
    def __init__(self):
        self.on = True
        self.order = []

    def work_stealing(self):
        return self.on

    def set_work_stealing(self, on):
        self.on = on


def test_each_pair_times_both_splits_in_alternating_order_and_the_default_comes_back(monkeypatch):
    kernels = FakeKernels()
    closed = []

    class Runtime(SimpleNamespace):  # open_runtime's result: the runtime, closed by its `with`
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            closed.append(True)

    runtime = Runtime(engine=SimpleNamespace(),
                      loaded=SimpleNamespace(name="fake", dtype="torch.float32", tokenizer=None, max_context=2048))

    def timed(engine, prompt, rows, tokens, rep):
        if rep > 0:
            kernels.order.append((rep, kernels.on))
        return rows * (0.002 if kernels.on else 0.003)  # stealing faster in every pair

    monkeypatch.setattr(work_split, "open_runtime", lambda *a, **k: runtime)
    monkeypatch.setattr(work_split, "native_kernels", lambda engine: kernels)
    monkeypatch.setattr(work_split, "chat_prompt_ids", lambda tok, prompt: [1, 2, 3])
    monkeypatch.setattr(work_split, "time_rows", timed)
    r = work_split.run_work_split(WorkSplitConfig(rows=(1, 6), repeats=4, neighbour_duties=(0.0,)))
    assert kernels.on and closed == [True]  # restored, closed
    assert kernels.order[:8] == [(1, False), (1, True), (2, True), (2, False), (3, False), (3, True), (4, True),
                                 (4, False)]
    one, six = r["rows"]
    assert (one["rows"], six["rows"]) == (1, 6) and one["neighbour"] == "none"
    assert six["static_over_stealing"] == pytest.approx(1.5) and six["stealing_faster_in"] == 4
    assert six["median_paired_difference_s"] == pytest.approx(-0.006)
    assert "stealing won" in work_split.format_work_split(r)


class FakeProcess:
    started = []

    def __init__(self, argv, **kwargs):
        self.argv, self.pid, self.killed, self.waited = argv, 12345, False, False
        FakeProcess.started.append(self)

    def kill(self):
        self.killed = True

    def wait(self):
        self.waited = True


def test_the_neighbour_runs_only_inside_the_block_even_when_it_fails(monkeypatch):
    pinned = []
    monkeypatch.setattr(work_split.subprocess, "Popen", FakeProcess)
    monkeypatch.setattr(work_split.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(work_split.os, "sched_setaffinity", lambda pid, cpus: pinned.append((pid, cpus)), raising=False)
    with neighbour(0.0) as what:
        assert what == "none" and not FakeProcess.started
    with pytest.raises(RuntimeError):
        with neighbour(0.3) as what:
            proc = FakeProcess.started[-1]
            assert not proc.killed and proc.argv[-2:] == ["0.3", str(os.getpid())] and pinned == [(12345, {1})]
            assert what == "busy 30 % of the time on CPU 1"
            raise RuntimeError("the measurement failed")
    assert proc.killed and proc.waited
    monkeypatch.setattr(work_split.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    with neighbour(0.3) as what:
        assert what == "none (fewer than 2 CPUs)" and len(FakeProcess.started) == 1


def test_the_neighbour_program_ends_when_its_parent_is_gone():
    """The neighbour's loop runs while its parent lives: given a parent pid that is not its parent, it exits at once."""
    proc = subprocess.run([sys.executable, "-c", work_split._NEIGHBOUR, "0.5", "1"], timeout=30)
    assert proc.returncode == 0
    start = time.monotonic()
    child = subprocess.Popen([sys.executable, "-c", work_split._NEIGHBOUR, "0.1", str(os.getpid())])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=0.5)  # its parent (this process) lives: it keeps running
    finally:
        child.kill()
        child.wait()
    assert time.monotonic() - start < 30
