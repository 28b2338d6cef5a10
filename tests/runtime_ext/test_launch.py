"""Launching servers and the SGLang Model Gateway (`runtime_ext.launch`, `scripts/launch_runtime`): the real
`smg` binary in front of stand-in SGLang workers keeps every chain on one worker, and the chains are the ones a
single server gives; the flags SGLang needs (mem-fraction when servers share a GPU) and no others."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from forerun.eval.presto.bench import run_pairs
from forerun.eval.presto.scaleout import sticky_fraction
from forerun.programs.sampler_config import PrefetchConfig, SamplerConfig
from forerun.runtime_ext import launch
from forerun.runtime_ext.pool import open_pool
from forerun.runtime_ext.protocol import SamplingParams
from forerun.runtime_ext.standin.server import BOS_ID, StandInServer

REPO = Path(__file__).resolve().parents[2]
def _smg_installed() -> bool:
    try:
        launch.smg_binary()
    except launch.LaunchError:
        return False
    return True


needs_smg = pytest.mark.skipif(not _smg_installed(), reason="the smg gateway is not installed (the test extra has it)")


def _chains(urls, slots):
    prompts = [(f"p{i}", [BOS_ID, *b"what is 2+%d?" % i]) for i in range(4)]
    cfg = SamplerConfig(kind="power-mh", response_length=8, block_size=8, steps_per_block=4, seed=3)
    with open_pool(backend_urls=urls, slots=slots) as pool:
        pairs = run_pairs(pool, prompts, [cfg], PrefetchConfig(budget=4))
    return [(tuple(r.response_ids), tuple(r.history)) for p in pairs for r in p.sequential + p.presto]


@needs_smg
def test_the_gateway_keeps_each_chain_on_one_worker_and_changes_no_chain(tmp_path):
    with StandInServer(serial=True) as a, StandInServer(serial=True) as b:
        reference = _chains([a.url], 1)
        a.routing_counts.clear()
        gw = launch.launch_gateway("127.0.0.1", launch.free_port(), [a.url, b.url], tmp_path / "gw.log", 60)
        try:
            got = _chains([gw.url], 2)
        finally:
            launch.stop([gw])
        counts = [dict(a.routing_counts), dict(b.routing_counts)]
    assert got == reference
    keys = {k for c in counts for k in c if k}
    assert len(keys) == 8  # one routing key per chain (4 prompts × sequential and PreSTO)
    assert sticky_fraction(counts) == 1.0  # every call of a chain on its one worker
    assert all(any(k for k in c) for c in counts)  # and both workers served chains


def test_sticky_fraction_is_the_main_workers_share_per_chain():
    assert sticky_fraction([{"a": 3, "b": 1}, {"a": 1, "b": 1, "": 9}]) == pytest.approx((3 / 4 + 1 / 2) / 2)
    assert sticky_fraction([{"": 5}]) is None


def test_a_chain_sends_its_routing_key_on_every_request():
    with StandInServer() as srv:
        with open_pool(backend_urls=[srv.url], slots=2) as pool, pool.lease() as one, pool.lease() as two:
            for rt in (one, two):
                rt.backend.run([BOS_ID, 1, 2], SamplingParams(max_new_tokens=2, seed=1, ignore_eos=True))
            keys = [rt.engine.routing_key for rt in (one, two)]
        assert keys[0] != keys[1] and all(srv.routing_counts.get(k) == 1 for k in keys)


@pytest.mark.parametrize("workers,gpus,extra,expected", [
    (1, 1, [], None),                      # a GPU of its own: SGLang's default
    (4, 4, [], None),
    (2, 1, [], 0.4),                       # two servers share one GPU
    (4, 2, [], 0.4),
    (3, 1, [], 0.26),
    (2, 1, ["--mem-fraction-static", "0.3"], None),  # the user's value, checked to fit
    (1, 0, [], None),                      # no GPU seen (stand-in workers)
])
def test_mem_fraction_static_only_when_servers_share_a_gpu(workers, gpus, extra, expected):
    assert launch.mem_fraction_static(workers, gpus, extra) == expected


def test_a_mem_fraction_that_cannot_fit_is_refused():
    with pytest.raises(launch.LaunchError, match="> 0.95"):
        launch.mem_fraction_static(2, 1, ["--mem-fraction-static=0.6"])


def test_server_flags_are_deterministic_by_default_and_never_session_radix_cache():
    argv = launch.server_argv("py", "sglang.launch_server", "m", "127.0.0.1", 30001, True, 0.4, ["--tp", "1"])
    assert "--enable-deterministic-inference" in argv and "--enable-session-radix-cache" not in argv
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.4" and argv[-2:] == ["--tp", "1"]
    assert "--enable-deterministic-inference" not in launch.server_argv("py", "x", "m", "h", 1, False, None, [])


def test_no_runtime_interpreter_is_one_line_and_exit_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FORERUN_SERVER_MODULE"}
    env["PYTHON"] = sys.executable  # the venv: the SGLang frontend only, no runtime
    res = subprocess.run(["bash", str(REPO / "scripts" / "launch_runtime"), "--port", "1"], capture_output=True,
                         text=True, timeout=120, env=env)
    if launch.has_runtime(sys.executable):
        pytest.skip("the SGLang runtime is installed here")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and "SGLang runtime" in res.stderr and "Traceback" not in res.stderr


def test_ctrl_c_while_the_gateway_starts_leaves_no_gateway_running(tmp_path, monkeypatch):
    """The gateway runs in a session of its own (Ctrl-C does not reach it): launch_gateway must stop it itself."""
    fake = tmp_path / "smg"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")
    fake.chmod(0o755)
    started = []
    real_start = launch.start_process
    monkeypatch.setattr(launch, "smg_binary", lambda: str(fake))
    monkeypatch.setattr(launch, "start_process", lambda *a, **k: started.append(real_start(*a, **k)) or started[-1])
    polls = iter([False, False])

    def ready(url, workers):
        if next(polls, None) is None:
            raise KeyboardInterrupt
        return False

    monkeypatch.setattr(launch, "gateway_ready", ready)
    with pytest.raises(KeyboardInterrupt):
        launch.launch_gateway("127.0.0.1", launch.free_port(), ["http://127.0.0.1:9"], tmp_path / "gw.log", 60)
    (proc,) = started
    try:
        assert proc.poll() is not None, "the gateway process outlived the interrupted launch"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
