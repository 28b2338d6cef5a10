"""The code sandbox against hostile programs: each one must be graded failed within its limits and leave the
machine as it was.  Both isolation paths run: "namespaces" (mount/net/pid namespaces where the OS allows)
and "rlimits" (the fallback: rlimits, privilege drop, Python-level socket block).  CI runs as root, so
file permissions alone prove nothing: the canaries sit in world-writable folders."""

from __future__ import annotations

import os
import socket
import tempfile
import time
from pathlib import Path

import pytest

from forerun.eval.graders.sandbox import SandboxLimits, isolation_report, run_sandboxed

FAST = SandboxLimits(cpu_s=1, wall_s=4, memory_bytes=256 << 20, processes=8)
MODES = ["namespaces", "rlimits"]


def _leftovers() -> list[int]:
    """Processes still running in a sandbox work directory."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if "forerun-sandbox-" in os.readlink(f"/proc/{entry}/cwd"):
                    out.append(int(entry))
            except OSError:
                pass
    return out


@pytest.fixture
def canary_dir():
    folder = Path(tempfile.mkdtemp(prefix="forerun-canary-"))
    folder.chmod(0o777)  # world-writable: only the sandbox, not permissions, can protect it
    (folder / "canary").write_text("alive")
    (folder / "canary").chmod(0o666)
    yield folder
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()


def test_report_names_the_modes():
    rep = isolation_report()
    assert rep["works"]
    assert rep["network"] in ("namespace", "blocked")
    if os.geteuid() == 0:
        assert rep["user"].startswith("uid 65534") or "failed" in rep["user"]


@pytest.mark.parametrize("mode", MODES)
def test_honest_program_passes_and_early_exit_does_not(mode):
    assert run_sandboxed("assert 1 + 1 == 2\nprint('done')", isolation=mode).completed
    assert not run_sandboxed("import sys\nsys.exit(0)\nassert False", isolation=mode).completed
    assert not run_sandboxed("import os\nos._exit(0)\nassert False", isolation=mode).completed
    assert not run_sandboxed("assert 1 + 1 == 3", isolation=mode).completed


@pytest.mark.parametrize("mode", MODES)
def test_infinite_loop_is_killed_by_the_cpu_limit(mode):
    t0 = time.monotonic()
    res = run_sandboxed("while True:\n    pass", limits=FAST, isolation=mode)
    assert not res.completed
    assert time.monotonic() - t0 < FAST.wall_s + 2
    assert not _leftovers()


def test_sleeping_forever_is_killed_by_the_wall_clock():
    res = run_sandboxed("import time\ntime.sleep(60)", limits=SandboxLimits(cpu_s=5, wall_s=1))
    assert not res.completed and res.killed_for == "wall-clock timeout"
    assert res.wall_s < 3
    assert not _leftovers()


@pytest.mark.parametrize("mode", MODES)
def test_fork_bomb_is_contained(mode):
    bomb = ("import os, time\n"
            "for _ in range(10000):\n"
            "    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)\n")
    res = run_sandboxed(bomb, limits=FAST, isolation=mode)
    assert not res.completed
    time.sleep(0.2)
    assert not _leftovers()


@pytest.mark.parametrize("mode", MODES)
def test_memory_bomb_fails(mode):
    res = run_sandboxed("blocks = []\nwhile True:\n    blocks.append(bytearray(50 << 20))", limits=FAST,
                        isolation=mode)
    assert not res.completed
    assert "MemoryError" in res.stderr or res.exit_code != 0


def test_writing_and_deleting_outside_the_workdir_lands_nowhere(canary_dir):
    """The namespaces path: every mount except the workdir is read-only, so even a world-writable folder
    (and, were the drop to nobody to fail, root) cannot be written."""
    if isolation_report().get("filesystem", "") == "":
        pytest.skip("no mount namespace on this machine (the rlimits test below covers the fallback)")
    target = canary_dir / "escaped"
    prog = (f"import os\nopen('inside.txt', 'w').write('ok')\n"
            f"open({str(target)!r}, 'w').write('escaped')\n")
    assert not run_sandboxed(prog).completed
    assert not run_sandboxed(f"import os\nos.remove({str(canary_dir / 'canary')!r})").completed
    probe = (f"import os\nres = []\n"
             f"for path in [{str(target)!r}, '/tmp/forerun-escaped', '/dev/shm/forerun-escaped', '/root/forerun-escaped']:\n"
             f"    try:\n        open(path, 'w').write('x'); res.append(path)\n    except OSError:\n        pass\n"
             f"try:\n    os.remove({str(canary_dir / 'canary')!r}); res.append('removed')\nexcept OSError:\n    pass\n"
             f"print(res)")
    res = run_sandboxed(probe)
    assert res.completed and res.stdout.strip() == "[]"
    assert (canary_dir / "canary").read_text() == "alive"
    assert sorted(p.name for p in canary_dir.iterdir()) == ["canary"]
    for p in ("/tmp/forerun-escaped", "/dev/shm/forerun-escaped", "/root/forerun-escaped"):
        assert not os.path.exists(p)


def test_rlimits_fallback_protects_what_the_unprivileged_user_cannot_write(canary_dir):
    """The fallback path, honestly: as root the program runs as nobody, so root-owned files are safe, but a
    world-writable folder is not (the namespaces path closes that)."""
    if os.geteuid() != 0:
        pytest.skip("the privilege drop applies when the grader runs as root")
    root_only = Path(tempfile.mkdtemp(prefix="forerun-rootonly-"))
    try:
        (root_only / "canary").write_text("alive")
        prog = f"import os\nos.remove({str(root_only / 'canary')!r})"
        assert not run_sandboxed(prog, isolation="rlimits").completed
        assert (root_only / "canary").read_text() == "alive"
    finally:
        (root_only / "canary").unlink()
        root_only.rmdir()


@pytest.mark.parametrize("mode", MODES)
def test_parent_environment_is_unreadable(mode, monkeypatch):
    if mode == "rlimits" and os.geteuid() != 0:
        pytest.skip("without namespaces a same-uid grader's /proc/PID/environ is readable (documented in sandbox.py)")
    secret = "forerun-secret-" + os.urandom(6).hex()
    monkeypatch.setenv("FORERUN_TEST_SECRET", secret)
    prog = (f"import os\nfound = [v for v in os.environ.values() if {secret!r} in v]\n"
            f"for pid in os.listdir('/proc'):\n"
            f"    try:\n        data = open('/proc/%s/environ' % pid, 'rb').read()\n    except OSError:\n        continue\n"
            f"    if {secret!r}.encode() in data:\n        found.append(pid)\n"
            f"assert found, 'secret not found'\n")
    res = run_sandboxed(prog, isolation=mode)
    assert not res.completed and "secret not found" in res.stderr


@pytest.mark.parametrize("mode", MODES)
def test_sockets_reach_nothing(mode):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        prog = (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                f"s.sendall(b'leak')\n")
        res = run_sandboxed(prog, isolation=mode)
        assert not res.completed
        with pytest.raises(BlockingIOError):
            server.accept()
        if mode == "rlimits" or isolation_report()["network"] == "blocked":
            assert "network access is disabled" in res.stderr
    finally:
        server.close()


def test_output_is_capped_by_the_file_size_limit():
    res = run_sandboxed("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
                        limits=SandboxLimits(cpu_s=2, wall_s=5, file_bytes=1 << 20))
    assert not res.completed
    assert len(res.stdout) <= 1 << 20
