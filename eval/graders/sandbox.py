"""Run untrusted code (a model's program plus a dataset's tests) in a subprocess sandbox.

`run_sandboxed(program, stdin=...)` writes the program into a fresh temporary directory and runs it through
`sandbox_child.py` (the launcher) and a small harness, with:

    guarantee                       how (isolation "namespaces": Linux, root or unprivileged user namespaces)
    fresh working directory         tempfile.mkdtemp, removed afterwards; cwd, HOME and TMPDIR point at it
    isolated Python                 `python -I` (no PYTHON* variables, no user site, no script dir on sys.path)
    cleared environment             the program sees PATH, LANG, HOME, TMPDIR and nothing else
    no network                      a new network namespace (loopback only, down); fallback: the harness
                                    replaces socket creation before the program runs (Python-level only)
    no writes outside the workdir   a private mount namespace in which every mount but the workdir is
                                    read-only (EROFS even for root); fallback: privileges dropped to nobody,
                                    so only world-writable places (/tmp, /dev/shm) stay writable
    parent's environment unseen     cleared env; a new pid namespace with a fresh /proc (other processes are
                                    invisible); as nobody, other users' /proc/PID/environ is unreadable
                                    (fallback as a non-root grader: same-uid processes stay readable)
    CPU, memory, files, processes   rlimits: CPU s, address space, file size, open files, processes, no core
    processes under root            privileges dropped to nobody (RLIMIT_NPROC is not enforced for root) and
                                    a watchdog that counts the session's processes and kills past the limit
    wall-clock timeout              the parent kills everything after `wall_s`
    nothing left running            SIGKILL to the process group and every process of the session; with a
                                    pid namespace, the kernel kills all of it when its pid 1 dies
    no fake pass                    passing needs exit status 0 AND a per-run nonce that the harness prints
                                    only after the program returned normally (sys.exit / os._exit fail)

`isolation_report()` says which of these took effect on this machine.  The sandbox defends against model
mistakes and ordinary hostile code, not against an attacker who escalates through a kernel exploit.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NOBODY = 65534
LAUNCHER = Path(__file__).with_name("sandbox_child.py")

HARNESS = r'''
import os, sys, runpy
_nonce = os.environ.pop("FORERUN_SANDBOX_NONCE", "")
if os.environ.pop("FORERUN_SANDBOX_NET", "") != "namespace":
    import socket as _s, _socket
    def _blocked(*a, **k):
        raise PermissionError("network access is disabled in the sandbox")
    class _NoSocket(_s.socket):
        def __init__(self, *a, **k):
            _blocked()
    _s.socket = _socket.socket = _NoSocket
    _s.create_connection = _s.socketpair = _s.fromfd = _socket.socketpair = _blocked
    if hasattr(_socket, "fromfd"):
        _socket.fromfd = _blocked
_main = sys.argv[1]
sys.argv = sys.argv[1:]
try:
    runpy.run_path(_main, run_name="__main__")
except SystemExit as _e:
    if _e.code not in (None, 0):
        raise
    sys.stderr.write("\nsandbox: the program called sys.exit() before its tests finished\n")
    sys.stderr.flush()
    os._exit(3)
sys.stdout.flush()
sys.stderr.write("\n" + _nonce + "\n")
sys.stderr.flush()
'''


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run."""

    cpu_s: float = 10.0
    """RLIMIT_CPU (seconds of CPU; SIGXCPU then SIGKILL one second later)."""
    wall_s: float = 20.0
    """Wall-clock timeout: the whole process tree is killed after this."""
    memory_bytes: int = 1 << 30
    """RLIMIT_AS: address space of each process."""
    file_bytes: int = 16 << 20
    """RLIMIT_FSIZE: largest file a process may write (also caps stdout/stderr)."""
    open_files: int = 64
    """RLIMIT_NOFILE."""
    processes: int = 32
    """RLIMIT_NPROC for the unprivileged user, and the watchdog's limit on the session's processes."""
    output_bytes: int = 1 << 20
    """stdout / stderr kept (each)."""

    def __post_init__(self) -> None:
        for name in ("cpu_s", "wall_s", "memory_bytes", "file_bytes", "open_files", "processes", "output_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed run did."""

    completed: bool
    """Exit status 0 and the harness's nonce seen: the program (and its tests) ran to the end."""
    exit_code: int | None
    stdout: str
    stderr: str
    wall_s: float
    killed_for: str | None = None
    """"wall-clock timeout" or "process limit" when the parent killed the run."""
    isolation: dict[str, Any] = field(default_factory=dict)
    """What took effect (network, filesystem, pids, user, rlimits), as the launcher reported it."""


def _world_executable(path: str) -> bool:
    p = Path(path).resolve()
    if not p.is_file() or not p.stat().st_mode & stat.S_IXOTH:
        return False
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in p.parents)


def sandbox_interpreter(drop_to_nobody: bool) -> str:
    """The Python that runs the program: this interpreter's base, or a system one that `nobody` may run."""
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    if not drop_to_nobody:
        return base
    for cand in (base, shutil.which("python3") or "", "/usr/bin/python3", "/usr/local/bin/python3"):
        if cand and _world_executable(cand):
            return os.path.realpath(cand)
    return ""


def _session_members(sid: int) -> list[int]:
    """Processes whose session id is `sid` (the launcher's pid; it is a session leader)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()
        if len(fields) > 3 and int(fields[3]) == sid:
            out.append(int(entry))
    return out


def _kill_all(sid: int) -> None:
    try:
        os.killpg(sid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in _session_members(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _prepare(workdir: Path, program: str, files: dict[str, str], owner: int | None) -> None:
    (workdir / "program.py").write_text(program, encoding="utf-8")
    (workdir / "_harness.py").write_text(HARNESS, encoding="utf-8")
    for name, text in files.items():
        if "/" in name or name.startswith("."):
            raise ValueError(f"sandbox file names must be plain names, got {name!r}")
        (workdir / name).write_text(text, encoding="utf-8")
    if owner is not None:
        for p in [workdir, *workdir.iterdir()]:
            os.chown(p, owner, owner)
    os.chmod(workdir, 0o700)


def _watch(proc: subprocess.Popen, limits: SandboxLimits) -> str | None:
    """Wait for the launcher; returns why it was killed (None: it exited by itself)."""
    deadline = time.monotonic() + limits.wall_s
    while True:
        try:
            proc.wait(timeout=0.05)
            return None
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() > deadline:
            return "wall-clock timeout"
        if len(_session_members(proc.pid)) > limits.processes + 3:  # + launcher, pid 1, harness
            return "process limit"


def _read(path: Path, limit: int) -> str:
    with open(path, "rb") as fh:
        return fh.read(limit).decode("utf-8", errors="replace")


def run_sandboxed(program: str, *, stdin: str | bytes = b"", limits: SandboxLimits = SandboxLimits(),
                  isolation: str = "namespaces", files: dict[str, str] | None = None) -> SandboxResult:
    """Run `program` (Python source) in the sandbox; `stdin` is its standard input.

    isolation: "namespaces" (default: namespaces where the OS allows, falling back per guarantee) or
    "rlimits" (skip the namespaces: the fallback path, for tests and for machines that forbid them)."""
    if isolation not in ("namespaces", "rlimits"):
        raise ValueError(f"isolation must be 'namespaces' or 'rlimits', got {isolation!r}")
    root = os.geteuid() == 0
    python = sandbox_interpreter(drop_to_nobody=root)
    drop = root and bool(python)
    python = python or sandbox_interpreter(drop_to_nobody=False)
    workdir = Path(tempfile.mkdtemp(prefix="forerun-sandbox-"))
    outdir = Path(tempfile.mkdtemp(prefix="forerun-sandbox-io-"))
    nonce = secrets.token_hex(16)
    try:
        _prepare(workdir, program, files or {}, NOBODY if drop else None)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        (outdir / "stdin").write_bytes(data)
        return _launch(python, workdir, outdir, nonce, limits, isolation, drop)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(outdir, ignore_errors=True)


def _config(python: str, workdir: Path, nonce: str, limits: SandboxLimits, isolation: str, drop: bool,
            status_fd: int) -> dict[str, Any]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(workdir),
           "TMPDIR": str(workdir), "FORERUN_SANDBOX_NONCE": nonce}
    return {"workdir": str(workdir), "argv": [python, "-I", "_harness.py", "program.py"], "env": env,
            "isolation": isolation, "uid": NOBODY if drop else None, "gid": NOBODY if drop else None,
            "status_fd": status_fd,
            "limits": {"cpu_s": max(1, int(round(limits.cpu_s))), "as_bytes": limits.memory_bytes,
                       "fsize_bytes": limits.file_bytes, "nofile": limits.open_files, "nproc": limits.processes}}


def _launch(python: str, workdir: Path, outdir: Path, nonce: str, limits: SandboxLimits, isolation: str,
            drop: bool) -> SandboxResult:
    r, w = os.pipe()
    cfg = _config(python, workdir, nonce, limits, isolation, drop, w)
    start = time.perf_counter()
    with open(outdir / "stdin", "rb") as fin, open(outdir / "stdout", "wb") as fout, \
            open(outdir / "stderr", "wb") as ferr:
        try:
            proc = subprocess.Popen([sandbox_interpreter(False), "-I", "-S", str(LAUNCHER), json.dumps(cfg)],
                                    cwd=workdir, env={}, stdin=fin, stdout=fout, stderr=ferr,
                                    start_new_session=True, pass_fds=(w,), close_fds=True)
        finally:
            os.close(w)
        try:
            killed_for = _watch(proc, limits)
        finally:
            _kill_all(proc.pid)
            proc.wait()
    wall = time.perf_counter() - start
    with os.fdopen(r, "rb") as fh:
        raw = fh.read()
    try:
        status = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        status = {"error": "unreadable launcher status"}
    stdout = _read(outdir / "stdout", limits.output_bytes)
    stderr = _read(outdir / "stderr", limits.output_bytes)
    code = proc.returncode
    lines = stderr.rstrip("\n").rsplit("\n", 1)
    completed = killed_for is None and code == 0 and lines[-1] == nonce
    if lines[-1] == nonce:
        stderr = lines[0] if len(lines) > 1 else ""
    return SandboxResult(completed=completed, exit_code=code, stdout=stdout, stderr=stderr, wall_s=wall,
                         killed_for=killed_for, isolation=status)


_REPORT: dict[str, Any] | None = None


def isolation_report() -> dict[str, Any]:
    """Which guarantees took effect here (runs one trivial program once per process)."""
    global _REPORT
    if _REPORT is None:
        res = run_sandboxed("print('ok')", limits=SandboxLimits(cpu_s=5, wall_s=20))
        _REPORT = dict(res.isolation, works=res.completed)
    return dict(_REPORT)


__all__ = ["SandboxLimits", "SandboxResult", "isolation_report", "run_sandboxed", "sandbox_interpreter"]
