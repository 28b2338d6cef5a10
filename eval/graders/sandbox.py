"""Run untrusted code (a model's program against a dataset's tests) in a subprocess sandbox.

Two entry points:

    run_tests(program, tests, preamble=...)   function tests (HumanEval, MBPP, LiveCodeBench functional): the
                                              program runs in one process (C), the tests in another (T); see
                                              `sandbox_inside` for why.  Passed = T's verdict.
    run_sandboxed(program, stdin=...)         a whole program (LiveCodeBench stdin tests): passed is decided by
                                              the grader, comparing `stdout` with an expected output that never
                                              enters the sandbox.  `completed` only says it exited 0 in time.

Guarantees (isolation "namespaces": Linux, root or unprivileged user namespaces; `sandbox_child` does it):

    guarantee                       how
    no fake pass                    the tests, their expected values and the verdict pipe are in T, another
                                    process (another uid as root; non-dumpable); C hands T plain data only,
                                    and T reads the verdict's nonce from a file unlinked before C starts
    fresh working directory         tempfile.mkdtemp, removed afterwards; cwd, HOME and TMPDIR point at it
    isolated Python                 the project's interpreter (`sys.executable`: its packages, numpy, are
                                    importable) with `-I` (no PYTHON* variables, no user site, no script dir
                                    on sys.path); a pyenv under /root is exposed read-only inside the mount
                                    namespace so that the run's uid can run it
    cleared environment             the program sees PATH, LANG, HOME, TMPDIR and nothing else
    no network                      a new network namespace (loopback only, down)
    no writes outside the workdir   a private mount namespace in which every mount but the workdir is
                                    read-only (EROFS even for root); the workdir is a tmpfs of `disk_bytes`
    other processes unseen          a new pid namespace with a fresh /proc
    CPU, memory, files, processes   rlimits (CPU s, address space, file size, open files, processes, no core);
                                    the watchdog sums the run's resident memory (`total_memory_bytes`);
                                    privileges dropped to a uid of the run's own (or every capability dropped inside a user
                                    namespace), no_new_privs; a watchdog counts the session's processes
    wall-clock timeout              the grader kills everything after `wall_s`
    nothing left running            SIGKILL to the process group and the session; pid 1's death kills the
                                    pid namespace; each process has PR_SET_PDEATHSIG towards its parent, so
                                    a grader killed with SIGKILL takes the whole tree with it

Fallback: without the mount, network and pid namespaces (isolation "rlimits", or a machine that forbids
them) nothing untrusted runs (`SandboxRefused`) unless the caller passes `allow_uncontained=True` or sets
FORERUN_SANDBOX_ALLOW_UNCONTAINED=1; then `NOT_CONTAINED` lists what is open.

The sandbox defends against model mistakes and hostile programs, not against kernel exploits.
"""

from __future__ import annotations

import itertools
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

RUN_UIDS = (1 << 30, 1 << 31)
"""When the grader is root, each run gets a pair of uids of its own from this range (no passwd entry): the
program's (even) and the tests' (the next one).  No other process on the machine, another sandbox included,
shares them, so the program cannot signal, trace or read any process but its own, and its process rlimit
counts its own processes only."""
LAUNCHER = Path(__file__).with_name("sandbox_child.py")
INSIDE = (Path(__file__).with_name("sandbox_inside.py"), Path(__file__).with_name("sandbox_wire.py"))
"""What runs inside the sandbox, copied into both the program's and the tests' directory."""
ALLOW_ENV = "FORERUN_SANDBOX_ALLOW_UNCONTAINED"
REFUSED_EXIT = 125
NOT_CONTAINED = {
    "network": "network: only Python's socket module is blocked; ctypes, os-level calls or a subprocess reach "
               "the network",
    "filesystem": "filesystem: the program can write wherever its user can (as root, a uid of its own: /tmp, "
                  "/dev/shm and other world-writable places; as a normal user: all of that user's files)",
    "processes": "processes: the program sees every process (as a normal user it can signal and trace every "
                 "process of the grader's user), and a daemon that leaves the session outlives the run if the "
                 "grader is killed",
    "verdict": "verdict (grader not root): the program runs as the grader's user and can reach the grader's "
               "and the tests' processes through /proc",
}


class SandboxRefused(RuntimeError):
    """The sandbox could not contain the program and the caller did not allow running it anyway."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run (each process: the program and the tests)."""

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
    total_memory_bytes: int = 2 << 30
    """Resident memory of all the run's processes together (the watchdog's check, every 0.1 s)."""
    disk_bytes: int = 64 << 20
    """Size of the work directory (a tmpfs of its own in the mount namespace): all files together."""

    def __post_init__(self) -> None:
        for name in ("cpu_s", "wall_s", "memory_bytes", "file_bytes", "open_files", "processes", "output_bytes",
                     "total_memory_bytes", "disk_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed whole program did."""

    completed: bool
    """Exit status 0 within the limits.  Not a pass: the caller compares `stdout` with what it expects."""
    exit_code: int | None
    stdout: str
    stderr: str
    wall_s: float
    killed_for: str | None = None
    """"wall-clock timeout", "process limit" or "memory limit" when the grader killed the run."""
    isolation: dict[str, Any] = field(default_factory=dict)
    """What took effect (network, filesystem, pids, user, interpreter, not_contained), as pid 1 reported it."""


@dataclass(frozen=True)
class SandboxVerdict:
    """What a program did against function tests."""

    passed: bool
    """The tests' process ran every test to the end without an error and said so on its own pipe."""
    error: str
    """Why not (the failing test's exception and line, "program: ..." when the program died or misbehaved,
    or the grader's reason: timeout, process limit, no verdict)."""
    stdout: str
    """The program's output (for diagnosis only)."""
    stderr: str
    wall_s: float
    killed_for: str | None = None
    isolation: dict[str, Any] = field(default_factory=dict)


def _uids_in_use() -> set[int]:
    """Real uids of every process visible in /proc."""
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                out.add(os.stat(f"/proc/{entry}").st_uid)
            except OSError:
                pass
    return out


def _run_uids() -> tuple[int, int]:
    """A fresh (program, tests) uid pair from RUN_UIDS that no running process holds."""
    used = _uids_in_use()
    while True:
        uid = RUN_UIDS[0] + 2 * secrets.randbelow((RUN_UIDS[1] - RUN_UIDS[0]) // 2 - 1)
        if uid not in used and uid + 1 not in used:
            return uid, uid + 1


def _world_executable(path: str) -> bool:
    p = Path(path).resolve()
    if not p.is_file() or not p.stat().st_mode & stat.S_IXOTH:
        return False
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in p.parents)


def sandbox_interpreter() -> str:
    """The project's interpreter (this one: its virtual environment's packages come along)."""
    return sys.executable or os.path.realpath(getattr(sys, "_base_executable", ""))


def fallback_interpreter() -> str:
    """An interpreter the run's uid cannot run without the mount namespace's help (fallback mode as root), or ""."""
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    for cand in (sys.executable, base, shutil.which("python3") or "", "/usr/bin/python3", "/usr/local/bin/python3"):
        if cand and _world_executable(cand):
            return cand
    return ""


def _interpreter_paths() -> list[str]:
    out = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
           os.path.dirname(os.path.realpath(sandbox_interpreter()))]
    return sorted({os.path.realpath(p) for p in out if p})


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


def _resident_bytes(sid: int, uids: tuple[int, ...]) -> int:
    """Resident memory of the run: the launcher's session and (as root) every process of the run's uids, a
    process that left the session with setsid() included (its real uid, from status: a non-dumpable process's
    /proc entry belongs to root)."""
    total, page = 0, os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
            fields = text[text.rfind(")") + 2:].split()
            ours = int(fields[3]) == sid
            if not ours and uids:
                status = Path(f"/proc/{entry}/status").read_text()
                uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
                ours = int(uid) in uids
            if ours:
                total += int(fields[21]) * page
        except (OSError, IndexError, ValueError, StopIteration):
            continue
    return total


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


def _watch(proc: subprocess.Popen, limits: SandboxLimits, uids: tuple[int, ...] = ()) -> str | None:
    """Wait for the launcher; returns why it was killed (None: it exited by itself).  Every 0.1 s it also sums
    the run's resident memory: RLIMIT_AS bounds each process, not `processes` of them together."""
    deadline = time.monotonic() + limits.wall_s
    for tick in itertools.count():
        try:
            proc.wait(timeout=0.02)
            return None
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() > deadline:
            return "wall-clock timeout"
        if len(_session_members(proc.pid)) > limits.processes + 4:  # + launcher, pid 1, tester, program
            return "process limit"
        if tick % 5 == 4 and _resident_bytes(proc.pid, uids) > limits.total_memory_bytes:
            return "memory limit"
    return None


def _read(path: Path, limit: int) -> str:
    with open(path, "rb") as fh:
        return fh.read(limit).decode("utf-8", errors="replace")


def _allowed(allow_uncontained: bool | None) -> bool:
    if allow_uncontained is not None:
        return allow_uncontained
    return os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes")


def describe_not_contained(missing: list[str]) -> str:
    return "; ".join(NOT_CONTAINED[m] for m in missing if m in NOT_CONTAINED)


class _Session:
    """The directories, pipes and launcher of one sandboxed run."""

    def __init__(self, limits: SandboxLimits, isolation: str, allow_uncontained: bool | None) -> None:
        if isolation not in ("namespaces", "rlimits"):
            raise ValueError(f"isolation must be 'namespaces' or 'rlimits', got {isolation!r}")
        self.limits, self.isolation, self.allow = limits, isolation, _allowed(allow_uncontained)
        self.root = os.geteuid() == 0
        self.uid, self.tester_uid = _run_uids() if self.root else (None, None)
        self.workdir = Path(tempfile.mkdtemp(prefix="forerun-sandbox-"))
        self.tester_dir = Path(tempfile.mkdtemp(prefix="forerun-sandbox-t-"))
        self.outdir = Path(tempfile.mkdtemp(prefix="forerun-sandbox-io-"))  # the grader's only (0700)
        (self.outdir / "stage").mkdir()

    def close(self) -> None:
        for d in (self.workdir, self.tester_dir, self.outdir):
            shutil.rmtree(d, ignore_errors=True)

    def prepare(self, program: str, files: dict[str, str]) -> None:
        (self.workdir / "program.py").write_text(program, encoding="utf-8")
        for src in INSIDE:
            shutil.copyfile(src, self.workdir / src.name)
            shutil.copyfile(src, self.tester_dir / src.name)
        for name, text in files.items():
            if "/" in name or name.startswith(".") or name in ("program.py", *(p.name for p in INSIDE)):
                raise ValueError(f"sandbox file names must be plain names, got {name!r}")
            (self.workdir / name).write_text(text, encoding="utf-8")
        if self.root:
            for p in [self.workdir, *self.workdir.iterdir()]:
                os.chown(p, self.uid, self.uid)
            for p in [self.tester_dir, *self.tester_dir.iterdir()]:
                os.chown(p, self.tester_uid, self.tester_uid)
        os.chmod(self.workdir, 0o700)
        os.chmod(self.tester_dir, 0o700)

    def config(self, mode: str, fds: dict[str, int]) -> dict[str, Any]:
        lim = self.limits
        return {"mode": mode, "workdir": str(self.workdir), "tester_dir": str(self.tester_dir),
                "python": sandbox_interpreter(), "python_fallback": fallback_interpreter(),
                "expose": _interpreter_paths(), "stage": str(self.outdir / "stage"), "isolation": self.isolation,
                "allow_uncontained": self.allow, "uid": self.uid, "gid": self.uid,
                "tester_uid": self.tester_uid, "tester_gid": self.tester_uid, "fds": fds, "grader_pid": os.getpid(),
                "limits": {"cpu_s": max(1, int(round(lim.cpu_s))), "as_bytes": lim.memory_bytes,
                           "fsize_bytes": lim.file_bytes, "nofile": lim.open_files, "nproc": lim.processes,
                           "disk_bytes": lim.disk_bytes}}

    def launch(self, mode: str, stdin: bytes, extra_fds: dict[str, int]) -> tuple[dict[str, Any], int, float, str | None]:
        """Run the launcher; returns (status, exit code, wall seconds, killed_for)."""
        status_r, status_w = os.pipe()
        fds = dict(extra_fds, status=status_w)
        cfg = self.config(mode, fds)
        (self.outdir / "stdin").write_bytes(stdin)
        start = time.perf_counter()
        with open(self.outdir / "stdin", "rb") as fin, open(self.outdir / "stdout", "wb") as fout, \
                open(self.outdir / "stderr", "wb") as ferr:
            try:
                proc = subprocess.Popen([sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(cfg)],
                                        cwd=self.workdir, env={}, stdin=fin, stdout=fout, stderr=ferr,
                                        start_new_session=True, pass_fds=tuple(fds.values()), close_fds=True)
            finally:
                for f in fds.values():
                    os.close(f)
            try:
                killed_for = _watch(proc, self.limits, (self.uid, self.tester_uid) if self.root else ())
            finally:
                _kill_all(proc.pid)
                proc.wait()
        wall = time.perf_counter() - start
        with os.fdopen(status_r, "rb") as fh:
            raw = fh.read()
        try:
            status = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            status = {"error": "unreadable launcher status"}
        if status.get("refused"):
            missing = status.get("not_contained") or []
            raise SandboxRefused(f"the sandbox cannot contain untrusted code here ({status['refused']}): "
                                 f"{describe_not_contained(missing)}. Pass allow_uncontained=True or set "
                                 f"{ALLOW_ENV}=1 to run it anyway.")
        if status.get("not_contained") and not self.root:
            status["not_contained"] = [*status["not_contained"], "verdict"]
        return status, proc.returncode, wall, killed_for

    def output(self, name: str) -> str:
        return _read(self.outdir / name, self.limits.output_bytes)


def run_sandboxed(program: str, *, stdin: str | bytes = b"", limits: SandboxLimits = SandboxLimits(),
                  isolation: str = "namespaces", files: dict[str, str] | None = None,
                  allow_uncontained: bool | None = None) -> SandboxResult:
    """Run `program` (Python source, as __main__) in the sandbox with `stdin` as its standard input.

    isolation: "namespaces" (default) or "rlimits" (skip the namespaces: the fallback path).  Raises
    `SandboxRefused` when the run would not be contained and `allow_uncontained` (default: the environment
    variable FORERUN_SANDBOX_ALLOW_UNCONTAINED) is not set."""
    s = _Session(limits, isolation, allow_uncontained)
    try:
        s.prepare(program, files or {})
        status, code, wall, killed_for = s.launch("plain", stdin.encode() if isinstance(stdin, str) else stdin, {})
        return SandboxResult(completed=killed_for is None and code == 0, exit_code=code, stdout=s.output("stdout"),
                             stderr=s.output("stderr"), wall_s=wall, killed_for=killed_for, isolation=status)
    finally:
        s.close()


def run_tests(program: str, tests: str, *, preamble: str = "", data: dict[str, Any] | None = None,
              program_names: tuple[str, ...] = (), call_timeout_s: float | None = None,
              limits: SandboxLimits = SandboxLimits(), isolation: str = "namespaces",
              allow_uncontained: bool | None = None) -> SandboxVerdict:
    """Run `program` in the sandbox and `tests` (Python source run after `preamble`, in a separate process)
    against it.  `data`: JSON values bound as globals of the tests (e.g. expected outputs); `call_timeout_s`:
    the longest the tests wait for one answer of the program.  The tests' free names that neither they nor
    the preamble define are the program's globals (remote proxies: calls, attributes, iteration; values come
    back as plain data), or standard-library modules; a builtin name is taken from the program only when it
    is in `program_names` (the entry point: MBPP 126 defines `sum`), so a program cannot replace the `abs`
    or `all` the tests check with.  Passed when the tests ran to the end without raising."""
    s = _Session(limits, isolation, allow_uncontained)
    try:
        s.prepare(program, {})
        nonce = secrets.token_hex(16)
        job_path = s.outdir / "job"
        job_path.write_text(json.dumps({"preamble": preamble, "tests": tests, "nonce": nonce, "data": data or {},
                                       "call_timeout_s": call_timeout_s, "program_names": list(program_names)}), encoding="utf-8")
        job = os.open(job_path, os.O_RDONLY)
        job_path.unlink()  # only the descriptor is left: T reads it, nobody can open it by name
        verdict_r, verdict_w = os.pipe()
        t_out = os.open(s.outdir / "tester_out", os.O_WRONLY | os.O_CREAT, 0o600)
        t_err = os.open(s.outdir / "tester_err", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            status, code, wall, killed_for = s.launch(
                "tests", b"", {"job": job, "verdict": verdict_w, "tester_out": t_out, "tester_err": t_err})
        finally:
            with os.fdopen(verdict_r, "rb") as fh:
                raw = fh.read(1 << 20)
        try:
            verdict = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            verdict = {}
        authentic = isinstance(verdict, dict) and verdict.get("nonce") == nonce
        passed = killed_for is None and code == 0 and authentic and verdict.get("passed") is True
        if passed:
            error = ""
        elif killed_for:
            error = killed_for
        elif not authentic:
            tail = s.output("tester_err").strip().splitlines()[-1:]
            error = f"no verdict from the tests (exit {code}{': ' + tail[0][:200] if tail else ''})"
        else:
            error = str(verdict.get("error") or f"exit {code}")
        return SandboxVerdict(passed=passed, error=error, stdout=s.output("stdout"), stderr=s.output("stderr"),
                             wall_s=wall, killed_for=killed_for, isolation=status)
    finally:
        s.close()


_REPORT: dict[str, Any] | None = None


def isolation_report() -> dict[str, Any]:
    """Which guarantees took effect here (runs one trivial program once per process; never refuses)."""
    global _REPORT
    if _REPORT is None:
        res = run_sandboxed("import sys\nprint(sys.flags.isolated)", limits=SandboxLimits(cpu_s=5, wall_s=20),
                            allow_uncontained=True)
        _REPORT = dict(res.isolation, works=res.completed and res.stdout.strip() == "1",
                       contained=not res.isolation.get("not_contained"))
    return dict(_REPORT)


__all__ = ["ALLOW_ENV", "NOT_CONTAINED", "SandboxLimits", "SandboxRefused", "SandboxResult", "SandboxVerdict",
           "fallback_interpreter", "isolation_report", "run_sandboxed", "run_tests", "sandbox_interpreter"]
