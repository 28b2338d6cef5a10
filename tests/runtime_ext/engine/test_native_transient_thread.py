"""native.on_transient_thread: torch work that is not the engine's leaves no OpenMP pool behind (a pooled thread
per extra pool would slow the engine's decode on a small machine; see the function's docstring)."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from forerun.runtime_ext.engine import native
from forerun.runtime_ext.engine.native import on_transient_thread

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def settle(expected: int, timeout: float = 5.0) -> int:
    """The thread count once it reaches `expected` (pool workers exit shortly after their thread), else the last."""
    deadline = time.monotonic() + timeout
    while os_threads() != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return os_threads()


def on_new_thread(fn) -> None:
    """fn() on a fresh thread (one that never ran OpenMP work), joined."""
    t = threading.Thread(target=fn)
    t.start()
    t.join()


def parallel_work() -> float:
    return float(torch.ones(1 << 23).sum())  # large enough for torch to run an OpenMP parallel region


def test_result_and_exception_pass_through_and_the_work_runs_on_another_thread():
    assert on_transient_thread(lambda a, b=0: (a + b, threading.get_ident()), 2, b=3)[0] == 5
    assert on_transient_thread(threading.get_ident) != threading.get_ident()
    with pytest.raises(KeyError, match="boom"):
        on_transient_thread(lambda: {}["boom"])


@pytest.fixture
def two_torch_threads():
    """Two torch threads (other tests may have set one), restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_parallel_torch_work_leaves_no_pool_on_the_calling_thread(two_torch_threads):
    seen: dict[str, int] = {}

    def caller() -> None:  # a thread that never ran OpenMP work: a pool it got would live as long as it
        before = os_threads()
        assert on_transient_thread(parallel_work) == float(1 << 23)
        seen["after transient"], seen["before"] = settle(before), before
        parallel_work()  # the control: the same work on this thread leaves its pool's workers behind
        seen["after inline"] = settle(before + 1, timeout=1.0)

    on_new_thread(caller)
    assert seen["after transient"] == seen["before"]
    assert seen["after inline"] > seen["before"]


def test_packing_weights_leaves_no_pool_on_the_calling_thread(two_torch_threads):
    """The engine packs a model's weights on the thread that loads it (often the main thread, pooled for its life):
    a parallel region there made every later decode step of the engine 1.5-2x slower."""
    kernels = native.kernels()
    if kernels is None:
        pytest.skip(f"native kernels unavailable: {native.unavailable_reason()}")
    ws = [torch.randn(4096, 256), torch.randn(1000, 256)]
    seen: dict[str, int] = {}

    def caller() -> None:
        before = os_threads()
        kernels.pack(ws)
        seen["after"], seen["before"] = settle(before, timeout=1.0), before

    on_new_thread(caller)
    assert seen["after"] == seen["before"]
