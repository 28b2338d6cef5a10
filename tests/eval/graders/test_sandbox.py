"""The code sandbox against hostile programs: each one must be graded failed within its limits and leave the
machine as it was.  Both isolation paths run: "namespaces" (mount/net/pid namespaces) and "rlimits" (the
fallback, which refuses untrusted code unless allowed).  CI runs as root, so file permissions alone prove
nothing: the canaries sit in world-writable folders, and the signal hunter looks everywhere a program can.

Oracles independent of the sandbox's own report: the hunter prints every candidate secret it found and the
test compares them with the nonce it forced; leftovers are found by scanning /proc from outside."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from forerun.eval.graders import sandbox
from forerun.eval.graders.sandbox import (ALLOW_ENV, SandboxLimits, SandboxRefused, isolation_report, run_sandboxed,
                                          run_tests)

FAST = SandboxLimits(cpu_s=1, wall_s=4, memory_bytes=256 << 20, processes=8)
MODES = ["namespaces", "rlimits"]
NONCE = os.urandom(16).hex()
"""The verdict's nonce, forced for the hunter tests: random, so that no file on the machine holds it."""
SECRET_VALUE = int.from_bytes(os.urandom(4), "big") % 900_000_000 + 100_000_000
"""An expected value no program could guess: it only exists in the tests (and is not in the program)."""


@pytest.fixture(autouse=True)
def private_tmp(monkeypatch, tmp_path_factory):
    """This test's sandbox directories live under a folder of its own, so that leftovers are found (and
    removed) without confusing them with other processes' sandboxes."""
    tmp_path_factory.getbasetemp()  # pytest's own temp root stays where it was
    base = Path(tempfile.mkdtemp(prefix="forerun-test-"))
    base.chmod(0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    yield base
    for pid in _sandboxed_pids(base):
        os.kill(pid, signal.SIGKILL)
    subprocess.run(["rm", "-rf", str(base)], check=False)


def _sandboxed_pids(base: Path | None = None) -> list[int]:
    """Processes whose working directory is one of this test's sandbox directories (seen from outside)."""
    base = str(base or tempfile.tempdir)
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/cwd").startswith(base + "/forerun-sandbox-"):
                    out.append(int(entry))
            except OSError:
                pass
    return out


def _wait_gone(seconds: float = 5.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := _sandboxed_pids()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _run(program: str, tests: str, mode: str = "namespaces", **kw):
    return run_tests(program, tests, isolation=mode, allow_uncontained=True, **kw)


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
    assert rep["works"] and rep["contained"] and rep["not_contained"] == []
    assert rep["network"] == "namespace" and rep["pids"] == "namespace (fresh /proc)"
    if os.geteuid() == 0:
        uid = int(rep["user"].removeprefix("uid "))
        assert sandbox.RUN_UIDS[0] <= uid < sandbox.RUN_UIDS[1] and uid % 2 == 0


# ------------------------------------------------------------------------------------ pass signal and verdict

@pytest.mark.parametrize("mode", MODES)
def test_honest_program_passes_and_wrong_or_early_exiting_ones_do_not(mode):
    assert _run("def f(x):\n    return 2 * x\n", "assert f(2) == 4\nassert f(5) == 10\n", mode).passed
    wrong = "def f(x):\n    return 0\n"
    for prefix in ("", "import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n", "raise SystemExit(0)\n"):
        res = _run(prefix + wrong, "assert f(2) == 4\n", mode)
        assert not res.passed, prefix
    for body in ("import sys; sys.exit(0)", "import os; os._exit(0)", "raise SystemExit(0)",
                 "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"):
        res = _run(f"def f(x):\n    {body}\n", "try:\n    f(2)\nexcept Exception:\n    pass\n", mode)
        assert not res.passed and res.error.startswith("program:"), (body, res.error)  # not catchable as Exception
    assert not _run("def f(x):\n    import os; os.kill(-1, 9)\n", "assert f(2) == 4\n", mode).passed


HUNTER = r'''
import ctypes, gc, glob, json, os, re, sys
HEX = re.compile(rb"[0-9a-f]{32}")
EXPECTED = re.compile(rb"f\(\) == (\d+)")  # the tests' "assert f() == <value>"
found, notes, value = set(), [], None

def scan(data):
    global value
    if isinstance(data, str):
        data = data.encode("utf-8", "ignore")
    found.update(m.group().decode() for m in HEX.finditer(data))
    for m in EXPECTED.finditer(data):
        value = int(m.group(1))

def read(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a pipe must not stall the hunt
    except OSError:
        return
    try:
        scan(os.read(fd, 1 << 20))
        notes.append("read " + path)
    except OSError:
        pass
    finally:
        os.close(fd)

def hunt():
    scan(repr(dict(os.environ)))
    for pat in ("/proc/self/environ", "/proc/self/cmdline", "/proc/self/fd/*", "/proc/[0-9]*/environ",
                "/proc/[0-9]*/cmdline", "/proc/[0-9]*/fd/*", "/proc/[0-9]*/mem", "/proc/[0-9]*/task/*/environ"):
        for path in glob.glob(pat):
            if not path.startswith(("/proc/self/", f"/proc/{os.getpid()}/")) or not path.endswith("/mem"):
                read(path)
    for root in (".", "..", "/tmp", "/dev/shm", "/var/tmp", os.path.expanduser("~")):
        budget = 4000  # files per root: a checkout (and its .venv) under /tmp must not stop the hunt by timeout
        for dirpath, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d not in (".venv", ".git", "site-packages")]
            if dirpath.count("/") > 6:
                dirs[:] = []
            for f in files[:budget]:
                read(os.path.join(dirpath, f))
            budget -= len(files)
            if budget <= 0:
                break
    frame = sys._getframe()
    while frame is not None:
        scan(repr(frame.f_globals)[:100000])
        scan(repr(frame.f_locals)[:100000])
        frame = frame.f_back
    for obj in gc.get_objects():
        if isinstance(obj, dict):
            scan(" ".join(v for v in obj.values() if isinstance(v, str))[:100000])
    libc = ctypes.CDLL(None, use_errno=True)
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid() and libc.ptrace(16, int(pid), None, None) == 0:
            notes.append("PTRACE OK " + pid)
    print("FOUND", sorted(found), "VALUE", value, "NOTES", [n for n in notes if "PTRACE" in n])
    sys.stdout.flush()

def fake_pass():
    fakes = [json.dumps({"nonce": n, "passed": True, "error": ""}).encode() for n in sorted(found)]
    fakes += [b'{"passed": true, "error": ""}', b'{"ready": true}\n{"ok": true}\n', b"PASSED\n"]
    fds = list(range(1024))
    for path in glob.glob("/proc/[0-9]*/fd/*"):
        if path.startswith(f"/proc/{os.getpid()}/"):
            continue  # its own fds are in the 0-1023 sweep
        try:
            fds.append(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            notes.append("reopened " + path)
        except OSError:
            pass
    print("REOPENED", [n for n in notes if "reopened" in n])
    sys.stdout.flush()
    for fd in fds:
        for blob in fakes:
            try:
                os.write(fd, blob)
            except OSError:
                pass
    os._exit(0)
'''


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("when", ["at load", "inside the call"])
def test_a_program_hunting_for_the_pass_signal_finds_nothing_and_fails(mode, when, monkeypatch):
    """The hunter reads the environment, /proc (its own, pid 1's, every visible process's environ, cmdline,
    fds and memory), every file under its cwd, its parent, /tmp, /dev/shm and HOME, its frames and every
    object in its heap, tries to ptrace everything, then writes forged verdicts (with every candidate
    nonce) to every fd it has and every /proc/PID/fd it can reopen, prints them and exits 0."""
    monkeypatch.setattr(sandbox.secrets, "token_hex", lambda n: NONCE)
    program = HUNTER
    if when == "at load":
        program += "hunt()\nfake_pass()\ndef f():\n    return 0\n"
    else:
        program += "def f():\n    hunt()\n    if value is not None:\n        return value\n    fake_pass()\n"
    res = _run(program, f"assert f() == {SECRET_VALUE}\n", mode, limits=SandboxLimits(cpu_s=20, wall_s=40))
    assert not res.passed, res
    assert "FOUND" in res.stdout, res.stdout[-2000:]  # the hunt ran to its end
    assert NONCE not in res.stdout and f"VALUE {SECRET_VALUE}" not in res.stdout
    assert "PTRACE OK" not in res.stdout and "reopened /" not in res.stdout, res.stdout[-2000:]


@pytest.mark.skipif(os.geteuid() != 0, reason="per-run uids need root; a normal user's fallback says so")
@pytest.mark.parametrize("mode", MODES)
def test_a_hunter_cannot_reach_another_sandbox_running_beside_it(mode):
    """Two graders at once (pytest-xdist, a parallel eval): the fallback hunter sees every process on the
    machine, but the other run's program and tests have uids of their own, so it can neither trace them nor
    reopen their descriptors.  With one shared uid (nobody) this found the other program at once."""
    import threading
    neighbour = threading.Thread(target=run_sandboxed, args=("import time\ntime.sleep(8)\n",),
                                 kwargs={"limits": SandboxLimits(cpu_s=5, wall_s=10)}, daemon=True)
    neighbour.start()
    deadline = time.monotonic() + 5
    while not _sandboxed_pids() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _sandboxed_pids(), "the neighbour sandbox did not start"
    res = _run(HUNTER + "hunt()\nfake_pass()\ndef f():\n    return 0\n", "assert f() == 1\n", mode,
               limits=SandboxLimits(cpu_s=20, wall_s=40))
    neighbour.join()
    assert "FOUND" in res.stdout and not res.passed, res
    assert "PTRACE OK" not in res.stdout and "reopened /" not in res.stdout, res.stdout[-2000:]


@pytest.mark.parametrize("mode", MODES)
def test_rigged_results_and_tampering_fail(mode):
    tests = "assert f(2) == 4\n"  # one check: a second one could catch a rigged object by accident
    rigged = {
        "always-equal result": "class A:\n    def __eq__(self, o):\n        return True\n    __ne__ = __eq__\n"
                               "def f(x):\n    return A()\n",
        "lying int subclass": "class I(int):\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n"
                              "def f(x):\n    return I(0)\n",
        "patched builtins": "import builtins\nbuiltins.AssertionError = type('E', (Exception,), {})\n"
                            "builtins.all = lambda *a: True\ndef f(x):\n    return 0\n",
        "own check and asserts": "def check(c):\n    pass\ndef f(x):\n    return 0\n__builtins__['__debug__'] = False\n",
        "fake verdict printed": "import json, sys\nprint(json.dumps({'passed': True}))\n"
                                "sys.stderr.write(json.dumps({'passed': True}))\ndef f(x):\n    return 0\n",
        "garbage on the wire": "import os\nos.write(4, b'{\"ready\": true}\\n{\"ok\": 4}\\n{\"ok\": 4}\\n')\n"
                               "def f(x):\n    return 0\n",
        "kills every process": "import os, signal\nfor p in os.listdir('/proc'):\n    if p.isdigit():\n        try:\n"
                               "            os.kill(int(p), signal.SIGKILL)\n        except OSError:\n            pass\n"
                               "def f(x):\n    return 0\n",
    }
    for name, program in rigged.items():
        res = _run(program, tests, mode)
        assert not res.passed, (name, res)


def test_a_stop_iteration_from_a_call_cannot_end_the_tests_loop_early():
    """In one process, f raising StopIteration inside `map(f, cases)` ends the loop: zero checks, a pass."""
    tests = "for got, want in zip(map(f, [1, 2]), [2, 4]):\n    assert got == want\n"
    assert _run("def f(x):\n    return 2 * x\n", tests).passed
    assert not _run("def f(x):\n    raise StopIteration\n", tests).passed
    assert not _run("import os\ndef f(x):\n    os.write(4, b'{\"stop\": true}\\n')\n    raise SystemExit\n", tests).passed


def test_the_tests_own_helpers_cannot_be_replaced_by_the_program():
    """HumanEval/38 style: the tests encode with the prompt's helper; a program that redefines the helper as
    the identity (and decodes with the identity) must fail."""
    preamble = "def encode(s):\n    return s[::-1]\n"
    tests = "for w in ['abc', 'hello']:\n    assert decode(encode(w)) == w\n"
    assert _run("def decode(s):\n    return s[::-1]\n", tests, preamble=preamble).passed
    assert not _run("def encode(s):\n    return s\ndef decode(s):\n    return s\n", tests, preamble=preamble).passed


def test_remote_objects_behave_for_honest_programs():
    program = textwrap.dedent("""
        class Node:
            def __init__(self, v, nxt=None):
                self.v, self.nxt = v, nxt
        def build(xs):
            head = None
            for x in reversed(xs):
                head = Node(x, head)
            return head
        def to_list(n):
            out = []
            while n:
                out.append(n.v)
                n = n.nxt
            return out
        def gen(n):
            yield from range(n)
        def boom():
            raise ValueError("bad input")
        import numpy as np
        def mean(xs):
            return np.mean(xs)
        """)
    tests = textwrap.dedent("""
        head = build([1, 2, 3])
        assert to_list(head) == [1, 2, 3] and head.v == 1 and head.nxt.nxt.v == 3
        assert list(gen(4)) == [0, 1, 2, 3] and sum(gen(5)) == 10
        try:
            boom()
            raise AssertionError("no exception")
        except ValueError as e:
            assert "bad input" in str(e)
        assert mean([1, 2, 3]) == 2.0 and type(mean([1, 2])) is float
        assert math.isclose(mean([0.1, 0.2]), 0.15)
        """)
    res = _run(program, tests)
    assert res.passed, res.error


def test_a_slow_answer_fails_when_the_tests_set_a_call_timeout():
    res = _run("import time\ndef f():\n    time.sleep(5)\n    return 1\n", "assert f() == 1\n", call_timeout_s=0.5)
    assert not res.passed and "no answer within" in res.error


# ------------------------------------------------------------------------------------------ limits

@pytest.mark.parametrize("mode", MODES)
def test_infinite_loop_is_killed_by_the_cpu_limit(mode):
    t0 = time.monotonic()
    res = run_sandboxed("while True:\n    pass", limits=FAST, isolation=mode, allow_uncontained=True)
    assert not res.completed
    assert time.monotonic() - t0 < FAST.wall_s + 2
    assert not _wait_gone(2)


def test_sleeping_forever_is_killed_by_the_wall_clock():
    res = run_sandboxed("import time\ntime.sleep(60)", limits=SandboxLimits(cpu_s=5, wall_s=1))
    assert not res.completed and res.killed_for == "wall-clock timeout"
    assert res.wall_s < 3
    assert not _wait_gone(2)


@pytest.mark.parametrize("mode", MODES)
def test_fork_bomb_is_contained(mode):
    bomb = ("import os, time\n"
            "for _ in range(10000):\n"
            "    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)\n")
    res = run_sandboxed(bomb, limits=FAST, isolation=mode, allow_uncontained=True)
    assert not res.completed
    assert not _wait_gone(3)


@pytest.mark.parametrize("mode", MODES)
def test_memory_bomb_fails(mode):
    res = run_sandboxed("blocks = []\nwhile True:\n    blocks.append(bytearray(50 << 20))", limits=FAST,
                        isolation=mode, allow_uncontained=True)
    assert not res.completed
    assert "MemoryError" in res.stderr or res.exit_code != 0


@pytest.mark.parametrize("leave_session", [False, True])
def test_memory_of_many_processes_together_is_capped(leave_session):
    """RLIMIT_AS bounds one process; `processes` children under it each hold their share: the watchdog sums the
    run's resident memory (a child that left the session with setsid() too, as root) and kills the run."""
    if leave_session and os.geteuid() != 0:
        pytest.skip("processes that leave the session are counted by the run's own uid (grader as root)")
    prog = textwrap.dedent(f"""
        import os, time
        for i in range(4):
            if os.fork() == 0:
                {'os.setsid()' if leave_session else 'pass'}
                b = bytearray(200 << 20)
                for j in range(0, len(b), 4096):
                    b[j] = 1
                os.write(1, b"held\\n")
                time.sleep(6)
                os._exit(0)
        for i in range(4):
            os.wait()
    """)
    res = run_sandboxed(prog, limits=SandboxLimits(cpu_s=5, wall_s=15, total_memory_bytes=384 << 20))
    assert not res.completed and res.killed_for == "memory limit", (res.killed_for, res.stdout, res.stderr[-300:])
    assert res.stdout.count("held") < 4 and res.wall_s < 10


def test_output_is_capped_by_the_file_size_limit():
    res = run_sandboxed("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
                        limits=SandboxLimits(cpu_s=2, wall_s=5, file_bytes=1 << 20))
    assert not res.completed
    assert len(res.stdout) <= 1 << 20


def test_the_workdir_is_capped_as_a_whole_not_only_file_by_file():
    """RLIMIT_FSIZE caps one file; many files under it must not fill the host's disk: the workdir holds at most
    `disk_bytes` (the program counts what it managed to write until ENOSPC)."""
    prog = ("n = 0\ntry:\n    for i in range(32):\n        open(f'f{i}', 'wb').write(b'x' * (1 << 20)); n += 1\n"
            "except OSError as e:\n    print(e.errno)\nprint(n)")
    res = run_sandboxed(prog, limits=SandboxLimits(cpu_s=2, wall_s=10, disk_bytes=8 << 20))
    out = res.stdout.split()
    assert res.completed and out[0] == "28" and int(out[-1]) <= 8, res.stdout  # ENOSPC after at most 8 MiB


# ------------------------------------------------------------------------------- filesystem, network, env

def test_writing_and_deleting_outside_the_workdir_lands_nowhere(canary_dir):
    """Every mount except the workdir is read-only, so even a world-writable folder (and, were the drop to
    nobody to fail, root) cannot be written."""
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
        assert not run_sandboxed(prog, isolation="rlimits", allow_uncontained=True).completed
        assert (root_only / "canary").read_text() == "alive"
    finally:
        (root_only / "canary").unlink()
        root_only.rmdir()


@pytest.mark.parametrize("mode", MODES)
def test_parent_environment_is_unreadable(mode, monkeypatch):
    if mode == "rlimits" and os.geteuid() != 0:
        pytest.skip("without namespaces a same-uid grader's /proc/PID/environ is readable (NOT_CONTAINED says so)")
    secret = "forerun-secret-" + os.urandom(6).hex()
    monkeypatch.setenv("FORERUN_TEST_SECRET", secret)
    prog = (f"import os\nfound = [v for v in os.environ.values() if {secret!r} in v]\n"
            f"for pid in os.listdir('/proc'):\n"
            f"    try:\n        data = open('/proc/%s/environ' % pid, 'rb').read()\n    except OSError:\n        continue\n"
            f"    if {secret!r}.encode() in data:\n        found.append(pid)\n"
            f"assert found, 'secret not found'\n")
    res = run_sandboxed(prog, isolation=mode, allow_uncontained=True)
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
        res = run_sandboxed(prog, isolation=mode, allow_uncontained=True)
        assert not res.completed
        with pytest.raises(BlockingIOError):
            server.accept()
        if mode == "rlimits":
            assert "network access is disabled" in res.stderr
    finally:
        server.close()


# ------------------------------------------------------------------------------------------ the fallback

def test_fallback_refuses_untrusted_code_unless_allowed_and_says_what_is_open(monkeypatch):
    marker = Path("/tmp") / f"forerun-refused-{os.getpid()}"  # world-writable: the fallback can write it
    prog = f"open({str(marker)!r}, 'w').write('ran')\n"
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    with pytest.raises(SandboxRefused) as err:
        run_sandboxed(prog, isolation="rlimits")
    for what in ("network", "filesystem", "processes", ALLOW_ENV):
        assert what in str(err.value)
    with pytest.raises(SandboxRefused):
        run_tests("def f():\n    return 1\n", "assert f() == 1\n", isolation="rlimits")
    assert not marker.exists()  # nothing ran
    monkeypatch.setenv(ALLOW_ENV, "1")
    res = run_sandboxed(prog, isolation="rlimits")
    try:
        assert res.completed and set(res.isolation["not_contained"]) >= {"network", "filesystem", "processes"}
    finally:
        marker.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- interpreter and -I isolation

def test_the_sandbox_runs_the_projects_python_isolated(monkeypatch, tmp_path):
    """numpy (a project dependency) imports; -I holds: no PYTHON* variables (a PYTHONPATH module stays
    unimportable), no user site, neither the script's nor the working directory on sys.path."""
    (tmp_path / "planted.py").write_text("X = 1\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("PYTHONSTARTUP", str(tmp_path / "planted.py"))
    prog = textwrap.dedent(f"""
        import os, sys, site
        import numpy
        assert sys.flags.isolated == 1 and sys.flags.ignore_environment == 1 and sys.flags.no_user_site == 1
        assert not site.ENABLE_USER_SITE
        assert os.getcwd() not in sys.path and '' not in sys.path, sys.path
        assert not [p for p in sys.path if {str(tmp_path)!r} in p]
        open('local_mod.py', 'w').write('Y = 2\\n')
        for name in ('planted', 'local_mod'):
            try:
                __import__(name)
                raise SystemExit('imported ' + name)
            except ImportError:
                pass
        print(sys.prefix)
        """)
    res = run_sandboxed(prog)
    assert res.completed, res.stderr
    assert res.stdout.strip() == sys.prefix
    assert res.isolation["interpreter"] == sys.executable
    assert run_tests("import numpy\ndef f():\n    return float(numpy.sqrt(4.0))\n", "assert f() == 2.0\n").passed


# ------------------------------------------------------------------------------ the tree dies with the grader

GRADER = """
import sys
from forerun.eval.graders.sandbox import SandboxLimits, run_sandboxed, run_tests
program = sys.argv[2]
limits = SandboxLimits(cpu_s=60, wall_s=120)
if sys.argv[1] == "plain":
    run_sandboxed(program, limits=limits, isolation=sys.argv[3], allow_uncontained=True)
else:
    run_tests(program, "f()", limits=limits, isolation=sys.argv[3], allow_uncontained=True)
"""
SLEEPER = """
import os, time
if os.fork() == 0:       # a grandchild that leaves the session: only the pid namespace and PDEATHSIG catch it
    os.setsid()
    time.sleep(120)
def f():
    time.sleep(120)
time.sleep(0 if __name__ != "__main__" else 120)
"""


@pytest.mark.parametrize("mode,kind", [("namespaces", "plain"), ("namespaces", "tests"), ("rlimits", "plain")])
def test_sigkill_of_the_grader_takes_the_sandboxed_tree_with_it(mode, kind, private_tmp):
    program = SLEEPER if mode == "namespaces" else SLEEPER.replace("if os.fork() == 0:", "if False:")
    grader = subprocess.Popen([sys.executable, "-c", GRADER, kind, program, mode],
                              env=dict(os.environ, TMPDIR=str(private_tmp)))
    try:
        deadline = time.monotonic() + 20
        while len(_sandboxed_pids()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _sandboxed_pids(), "the sandbox never started"
        time.sleep(0.3)
        os.kill(grader.pid, signal.SIGKILL)
        grader.wait()
        assert not _wait_gone(5), "sandboxed processes outlived the grader"
    finally:
        if grader.poll() is None:
            grader.kill()


def test_process_tree_is_gone_after_a_normal_run():
    daemon = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
              "def f():\n    return 1\n")
    assert run_tests(daemon, "assert f() == 1\n").passed
    assert not _wait_gone(3)


def test_results_are_json_serialisable():
    res = run_tests("def f():\n    return 1\n", "assert f() == 1\n")
    json.dumps(res.isolation)
