"""The sandbox launcher: run as `python -I -S sandbox_child.py CONFIG_JSON` by `sandbox.run_sandboxed`.

Standard library only, and no forerun import: it starts as the grader's user (root in CI) and ends by
exec'ing the sandboxed interpreter.  What it does, in order (each step best-effort, and what took effect
is written as JSON to the status pipe before the user program starts):

1. namespaces (isolation "namespaces"): `unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC
   | CLONE_NEWUTS)` as root, or with CLONE_NEWUSER first as a normal user.  The new network namespace has
   only a loopback device that is down: no network at all.
2. filesystem (needs the mount namespace): every mount is made private, the work directory is bind-mounted
   onto itself, and every other mount is remounted read-only (bind remount, keeping nosuid/nodev/noexec).
   Writes outside the work directory fail with EROFS even for root; nothing leaks to the host's mounts.
3. pids: a fork makes the child pid 1 of the new pid namespace, with PR_SET_PDEATHSIG = SIGKILL; it mounts
   a fresh /proc (other processes, and their environments, are invisible) and forks the program.  When pid 1
   exits or is killed, the kernel kills every process left in the namespace, including any that left the
   process group with setsid().
4. privileges: as root, drop to `uid`/`gid` (nobody) with no supplementary groups, so file permissions and
   RLIMIT_NPROC bind (RLIMIT_NPROC is not enforced for root).
5. rlimits: CPU seconds, address space, file size, open files, processes; no core files.
6. exec the interpreter with a cleared environment.

    config key      meaning
    workdir         the fresh temporary directory (cwd, the only writable place)
    argv            the program's argv (argv[0]: the interpreter)
    env             the program's whole environment
    isolation       "namespaces" (try 1-3) or "rlimits" (skip 1-3)
    uid, gid        the unprivileged ids to drop to when running as root (null: do not drop)
    limits          cpu_s, as_bytes, fsize_bytes, nofile, nproc
    status_fd       write end of the status pipe
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG = 1
_FLAG_OPTIONS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), None), f"mount {target}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def enter_namespaces(status: dict) -> int:
    """unshare the namespaces (all of them, else network + pids, else network only); returns the flags that
    took effect (0: none)."""
    uid, gid = os.getuid(), os.getgid()
    user = CLONE_NEWUSER if uid != 0 else 0
    wanted = (CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS,
              CLONE_NEWNET | CLONE_NEWPID, CLONE_NEWNET)
    flags = 0
    for candidate in wanted:
        if _libc.unshare(candidate | user) == 0:
            flags = candidate | user
            break
        status.setdefault("namespaces_error", os.strerror(ctypes.get_errno()))
    if not flags:
        return 0
    if user:  # map our uid to root inside, so that mounts are ours to change
        try:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"0 {uid} 1")
            _write("/proc/self/gid_map", f"0 {gid} 1")
        except OSError as e:
            status["namespaces_error"] = f"user namespace id maps: {e}"
            flags &= ~CLONE_NEWNS
    if flags & CLONE_NEWNET:
        status["network"] = "namespace"
    return flags


def _mount_points() -> list[tuple[str, set[str]]]:
    out = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            parts = line.split()
            point = parts[4].encode().decode("unicode_escape")  # \040 etc.
            out.append((point, set(parts[5].split(","))))
    return out


def protect_filesystem(workdir: str, status: dict) -> None:
    """Private mounts, the work directory writable, every other mount read-only."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount(workdir, workdir, None, MS_BIND | MS_REC)
    failed = []
    for point, options in _mount_points():
        if point == workdir or point.startswith(workdir + "/") or "ro" in options:
            continue
        keep = sum(flag for name, flag in _FLAG_OPTIONS.items() if name in options)
        try:
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)
        except OSError:
            failed.append(point)
    status["filesystem"] = "read-only outside the work directory" + (f" (not remounted: {failed})" if failed else "")
    status["readonly_failed"] = failed


def drop_privileges(uid: int | None, gid: int | None, status: dict) -> None:
    if os.geteuid() != 0 or uid is None:
        status["user"] = f"uid {os.getuid()} (not root: kept)"
        return
    try:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        status["user"] = f"uid {uid}"
    except OSError as e:  # e.g. inside a user namespace where `uid` is not mapped
        status["user"] = f"uid {os.getuid()} (drop to {uid} failed: {e.strerror})"


def set_limits(limits: dict, status: dict) -> None:
    cpu = int(limits["cpu_s"])
    pairs = {
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_AS: (limits["as_bytes"],) * 2,
        resource.RLIMIT_FSIZE: (limits["fsize_bytes"],) * 2,
        resource.RLIMIT_NOFILE: (limits["nofile"],) * 2,
        resource.RLIMIT_NPROC: (limits["nproc"],) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    for res, (soft, hard) in pairs.items():
        resource.setrlimit(res, (int(soft), int(hard)))
    status["rlimits"] = "cpu, as, fsize, nofile, nproc, core"
    status["nproc_binds"] = os.getuid() != 0


def _exit_like(wait_status: int) -> None:
    if os.WIFSIGNALED(wait_status):
        os._exit(128 + os.WTERMSIG(wait_status))
    os._exit(os.waitstatus_to_exitcode(wait_status))


def run_program(cfg: dict, status: dict, new_pid_ns: bool) -> None:
    """In pid 1 of the namespace (or the launcher's child): mount /proc, fork the program, wait, exit."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if new_pid_ns and status.get("filesystem"):
        try:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            status["pids"] = "namespace (fresh /proc)"
        except OSError as e:
            status["pids"] = f"namespace (/proc not remounted: {e.strerror})"
    elif new_pid_ns:
        status["pids"] = "namespace"
    child = os.fork()
    if child == 0:
        drop_privileges(cfg.get("uid"), cfg.get("gid"), status)
        set_limits(cfg["limits"], status)
        env = dict(cfg["env"])
        env["FORERUN_SANDBOX_NET"] = status.get("network", "blocked")
        os.write(cfg["status_fd"], json.dumps(status).encode())
        os.close(cfg["status_fd"])
        os.execve(cfg["argv"][0], cfg["argv"], env)
    os.close(cfg["status_fd"])
    _, st = os.waitpid(child, 0)
    _exit_like(st)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    status: dict = {"isolation": cfg["isolation"], "network": "blocked", "filesystem": "", "pids": "process group"}
    flags = enter_namespaces(status) if cfg["isolation"] == "namespaces" else 0
    if flags & CLONE_NEWNS:
        try:
            protect_filesystem(os.path.realpath(cfg["workdir"]), status)
        except OSError as e:
            status["filesystem"] = ""
            status["filesystem_error"] = str(e)
    os.chdir(cfg["workdir"])
    pid = os.fork()
    if pid == 0:
        run_program(cfg, status, bool(flags & CLONE_NEWPID))
    os.close(cfg["status_fd"])
    _, st = os.waitpid(pid, 0)
    _exit_like(st)


if __name__ == "__main__":
    main()
