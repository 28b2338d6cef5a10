"""The sandbox launcher: run as `python -I -S sandbox_child.py CONFIG_JSON` by `sandbox.py`.

Standard library only, and no forerun import: it starts as the grader's user (root in CI) and ends by
exec'ing the sandboxed interpreter(s).  In order:

0. death with the grader: PR_SET_PDEATHSIG = SIGKILL, then a check that the grader (`grader_pid`) is still
   the parent (it may have died before the prctl).  Every process below sets the same signal towards its
   own parent, so killing the grader kills the launcher, which kills pid 1, whose death kills the namespace.
1. namespaces (isolation "namespaces"): `unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC
   | CLONE_NEWUTS)` as root, or with CLONE_NEWUSER first as a normal user.  The new network namespace has
   only a loopback device that is down: no network at all.
2. filesystem (needs the mount namespace): every mount is made private, the work directory is bind-mounted
   onto itself, and every other mount is remounted read-only.  Writes outside the work directory fail with
   EROFS even for root.  Then the interpreter is exposed: a directory on its path that the unprivileged user
   cannot enter (a pyenv under /root) is covered by a read-only tmpfs holding only bind mounts of the
   interpreter's prefixes, so the sandbox runs the project's Python, with its packages, as the run's uid.
3. pid 1 (a fork, in the new pid namespace): PDEATHSIG, non-dumpable, a fresh /proc (other processes and
   their environments are invisible).  When pid 1 dies the kernel kills everything left in the namespace,
   including processes that left the process group with setsid().  Without a pid namespace (fallback) it is
   a child subreaper instead and kills its descendants before it exits.
4. containment check: without the mount, network and pid namespaces, a read-only filesystem and a fresh
   /proc, pid 1 refuses to run anything (status "refused", exit 125) unless `allow_uncontained` is set.
5. the processes, each: fds moved into place and every other fd closed, privileges dropped (as root: to
   `uid`/`gid` with no supplementary groups; as a normal user inside a user namespace: every capability
   dropped, SECBIT_NOROOT locked), no_new_privs, PDEATHSIG, rlimits, exec with a cleared environment.
   mode "plain": one process, the program, on the launcher's stdin/stdout/stderr.
   mode "tests": the tester T (uid `tester_uid`) and the program C (uid `uid`).  When both run as the same
   uid (a user namespace), C starts only once T has read its job and made itself non-dumpable (one byte on
   the ready pipe); with different uids C cannot reach T anyway and both start at once.  T and C talk over
   two pipes; T alone holds the verdict pipe.  When T exits, C and everything else is killed.

    config key      meaning
    mode            "plain" or "tests"
    workdir         C's fresh temporary directory (cwd, the only writable place)
    tester_dir      T's directory (mode "tests")
    python          the interpreter; python_fallback: one the unprivileged user can run (fallback mode)
    expose          directories the interpreter needs (its prefixes)
    stage           an empty directory for staging those mounts
    isolation       "namespaces" (try 1-2) or "rlimits" (skip 1-2)
    allow_uncontained  run even when step 4 finds something not contained
    uid, gid        the program's unprivileged ids when running as root (null: do not drop)
    tester_uid, tester_gid  the tester's
    limits          cpu_s, as_bytes, fsize_bytes, nofile, nproc, disk_bytes (the work directory's tmpfs)
    fds             status (write end of the status pipe); mode "tests": job, verdict, tester_out, tester_err
    grader_pid      the grader's pid (step 0)
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import stat
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
CONTAINING = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_SECUREBITS = 1, 4, 24, 28
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 36, 38, 47, 4
SECBIT_LOCKED_NOROOT = 0x01 | 0x02 | 0x04 | 0x08  # NOROOT, NOROOT_LOCKED, NO_SETUID_FIXUP(_LOCKED)
REFUSED_EXIT = 125
_FLAG_OPTIONS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _prctl(option: int, arg: int = 0) -> int:
    return _libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def die_with_parent(parent: int) -> None:
    """SIGKILL when the parent dies; exit now if it already has (we were reparented before the prctl)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


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


def _remount_readonly(point: str, options: set[str]) -> None:
    keep = sum(flag for name, flag in _FLAG_OPTIONS.items() if name in options)
    _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)


def protect_filesystem(workdir: str, expose_paths: list[str], stage: str, status: dict, cfg: dict) -> None:
    """Private mounts (nothing below propagates to the host), the interpreter exposed, the work directory
    a writable tmpfs of its own, every other mount read-only."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    expose(expose_paths, stage, status)
    private_workdir(workdir, cfg.get("uid"), cfg["limits"]["disk_bytes"])
    failed = []
    for point, options in _mount_points():
        if point == workdir or point.startswith(workdir + "/") or "ro" in options:
            continue
        try:
            _remount_readonly(point, options)
        except OSError:
            failed.append(point)
    status["filesystem"] = "read-only outside the work directory" + (f" (not remounted: {failed})" if failed else "")
    status["readonly_failed"] = failed


def private_workdir(workdir: str, owner: int | None, size: int) -> None:
    """Cover the work directory with a tmpfs of `size` bytes holding a copy of its files (owned by `owner`):
    RLIMIT_FSIZE caps each file, this caps them all, so a program cannot fill the host's disk."""
    below = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
    _mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},nr_inodes=4096,mode=700")
    for name in os.listdir(below):
        with open(name, "rb", opener=lambda n, f: os.open(n, f, dir_fd=below)) as src, \
                open(os.path.join(workdir, name), "wb") as dst:
            dst.write(src.read())
        if owner is not None:
            os.chown(os.path.join(workdir, name), owner, owner)
    if owner is not None:
        os.chown(workdir, owner, owner)
    os.close(below)


def _blocking_ancestor(path: str) -> str | None:
    """The outermost directory on `path`'s chain (itself excluded) that others may not enter."""
    parts = path.strip("/").split("/")
    for i in range(len(parts) - 1):
        d = "/" + "/".join(parts[: i + 1])
        if not os.stat(d).st_mode & stat.S_IXOTH:
            return d
    return None


def expose(paths: list[str], stage: str, status: dict) -> None:
    """Make `paths` (the interpreter's prefixes) reachable by an unprivileged user: each directory on their
    way that others cannot enter is covered by a tmpfs holding only bind mounts of `paths` (all of it is
    remounted read-only with every other mount afterwards)."""
    plan = []
    real = sorted(set(os.path.realpath(x) for x in paths))
    for p in real:
        if any(p.startswith(q + "/") for q in real):
            continue  # inside another one
        anc = _blocking_ancestor(p)
        if anc is not None:
            plan.append((anc, p))
    if not plan:
        return
    staged = []
    for i, (anc, p) in enumerate(plan):  # bind each path aside before its ancestor is covered
        s = os.path.join(stage, str(i))
        os.mkdir(s, 0o700)
        _mount(p, s, None, MS_BIND | MS_REC)
        staged.append((anc, p, s))
    covers = sorted({a for a, _ in plan if not any(a != b and a.startswith(b + "/") for b, _ in plan)})
    for anc in covers:
        _mount("tmpfs", anc, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=64k")
    for _, p, s in staged:
        cover = next(c for c in covers if p.startswith(c + "/"))
        d = cover
        for part in p[len(cover) + 1:].split("/"):
            d = os.path.join(d, part)
            if not os.path.isdir(d):
                os.mkdir(d)
                os.chmod(d, 0o755)
        _mount(s, p, None, MS_MOVE)
    status["exposed"] = sorted(p for _, p in plan)


def reachable(path: str, uid: int | None) -> bool:
    """Can `uid` (None: us) execute `path`?  Others' permission bits only: uid is not the owner."""
    if uid is None:
        return os.access(path, os.X_OK)
    real = os.path.realpath(path)
    try:
        if not os.stat(real).st_mode & stat.S_IXOTH:
            return False
        return all(os.stat(d).st_mode & stat.S_IXOTH for d in _parents(real) + _parents(os.path.abspath(path)))
    except OSError:
        return False


def _parents(p: str) -> list[str]:
    out, d = [], os.path.dirname(p)
    while d and d != "/":
        out.append(d)
        d = os.path.dirname(d)
    return out


def drop_capabilities() -> None:
    """Inside a user namespace we are uid 0 with every capability: give them all up, for good."""
    _check(_prctl(PR_SET_SECUREBITS, SECBIT_LOCKED_NOROOT), "PR_SET_SECUREBITS")
    for cap in range(64):
        if _prctl(PR_CAPBSET_DROP, cap) != 0 and ctypes.get_errno() != 22:  # EINVAL: no such capability
            _check(-1, f"PR_CAPBSET_DROP {cap}")
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    hdr, data = Header(0x20080522, 0), (Data * 2)()
    _check(_libc.capset(ctypes.byref(hdr), data), "capset")


def become(uid: int | None, gid: int | None) -> None:
    """Drop to `uid`/`gid` (as root), or drop every capability (a user namespace's root); then no_new_privs."""
    if os.geteuid() == 0 and uid is not None and not _in_user_namespace():
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        if os.getresuid() != (uid, uid, uid):
            raise OSError("setresuid did not take")
    elif os.geteuid() == 0:
        drop_capabilities()
    _check(_prctl(PR_SET_NO_NEW_PRIVS, 1), "PR_SET_NO_NEW_PRIVS")


def _in_user_namespace() -> bool:
    try:
        with open("/proc/self/uid_map") as fh:
            return fh.read().split() != ["0", "0", "4294967295"]
    except OSError:
        return False


def set_limits(limits: dict) -> None:
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


def spawn(cfg: dict, argv: list[str], fds: dict[int, int], ids: tuple[int | None, int | None], cwd: str,
          env: dict) -> int:
    """Fork a sandboxed process: `fds` {target: source} become its only fds; it execs `argv`."""
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:
        import fcntl
        moved = {t: fcntl.fcntl(s, fcntl.F_DUPFD, 256) for t, s in fds.items()}
        for t, s in moved.items():
            os.dup2(s, t, inheritable=True)
        os.closerange(max(fds) + 1, 1 << 16)
        os.chdir(cwd)
        become(*ids)
        die_with_parent(parent)  # after the uid change, which clears the parent-death signal
        set_limits(cfg["limits"])
        for exe in (argv[0], cfg.get("python_fallback") or ""):
            if exe:
                try:
                    os.execve(exe, [exe, *argv[1:]], env)
                except OSError:
                    continue
    except BaseException as e:  # noqa: BLE001 - nothing may run if the set-up failed
        try:
            os.write(2, f"sandbox: could not start the process: {e}\n".encode())
        finally:
            os._exit(126)
    os._exit(126)


def _exit_like(wait_status: int) -> None:
    if os.WIFSIGNALED(wait_status):
        os._exit(128 + os.WTERMSIG(wait_status))
    os._exit(os.waitstatus_to_exitcode(wait_status))


def _kill_descendants() -> None:
    """Fallback (no pid namespace): as a child subreaper every orphan of ours is our child; kill them all."""
    me = str(os.getpid())
    for _ in range(100):
        kids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as fh:
                        text = fh.read()
                except OSError:
                    continue
                if text[text.rfind(")") + 2:].split()[1] == me:
                    kids.append(int(entry))
        for k in kids:
            try:
                os.kill(k, signal.SIGKILL)
            except OSError:
                pass
        try:
            while os.waitpid(-1, 0 if kids else os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return


def not_contained(flags: int, status: dict) -> list[str]:
    missing = []
    if not flags & CLONE_NEWNET:
        missing.append("network")
    if not (flags & CLONE_NEWNS and status.get("filesystem") and not status.get("readonly_failed")):
        missing.append("filesystem")
    if not (flags & CLONE_NEWPID and status.get("pids") == "namespace (fresh /proc)"):
        missing.append("processes")
    return missing


def start_tests(cfg: dict, python: str, env: dict, prog_ids: tuple, test_ids: tuple) -> int:
    """Mode "tests": start the tester T and the program C, wired together; returns T's pid."""
    fd, here = cfg["fds"], "sandbox_inside.py"
    t2c, c2t, ready = os.pipe(), os.pipe(), os.pipe()
    t_env = dict(env, HOME=cfg["tester_dir"], TMPDIR=cfg["tester_dir"])
    tester = spawn(cfg, [python, "-I", "-S", here, "tester"],
                   {0: fd["job"], 1: fd["tester_out"], 2: fd["tester_err"], 3: fd["verdict"], 4: t2c[1],
                    5: c2t[0], 6: ready[1]}, test_ids, cfg["tester_dir"], t_env)
    for f in (fd["job"], fd["tester_out"], fd["tester_err"], fd["verdict"], t2c[1], c2t[0], ready[1]):
        os.close(f)

    def start_program() -> None:
        null = os.open("/dev/null", os.O_RDONLY)
        c_env = dict(env, HOME=cfg["workdir"], TMPDIR=cfg["workdir"])
        spawn(cfg, [python, "-I", here, "program", "program.py"], {0: null, 1: 1, 2: 2, 3: t2c[0], 4: c2t[1]},
              prog_ids, cfg["workdir"], c_env)
        os.close(null)

    # Another uid cannot reach T's /proc entries or ptrace it at all: start both at once.  With one uid
    # (a user namespace) C waits until T has read its job and made itself non-dumpable.
    early = test_ids[0] is not None and test_ids[0] != prog_ids[0]
    if early:
        start_program()
    try:
        got = os.read(ready[0], 1)
    except OSError:
        got = b""
    os.close(ready[0])
    if got == b"1" and not early:
        start_program()
    for f in (t2c[0], c2t[1]):
        os.close(f)
    return tester


def own_pids(flags: int, status: dict) -> None:
    """A fresh /proc for the new pid namespace; without one, become a child subreaper (orphans come to us)."""
    if flags & CLONE_NEWPID and status.get("filesystem"):
        try:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            status["pids"] = "namespace (fresh /proc)"
        except OSError as e:
            status["pids"] = f"namespace (/proc not remounted: {e.strerror})"
    elif flags & CLONE_NEWPID:
        status["pids"] = "namespace"
    else:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        status["pids"] = "subreaper (other processes visible)"


def pid1(cfg: dict, status: dict, flags: int, launcher: int) -> None:
    """The namespace's init (or, without a pid namespace, a subreaper): start the processes, wait, clean up."""
    die_with_parent(0 if flags & CLONE_NEWPID else launcher)  # a parent outside our pid namespace reads as 0
    _prctl(PR_SET_DUMPABLE, 0)
    own_pids(flags, status)
    missing = not_contained(flags, status)
    status["not_contained"] = missing
    fd = cfg["fds"]
    if missing and not cfg["allow_uncontained"]:
        status["refused"] = "not contained: " + ", ".join(missing)
        os.write(fd["status"], json.dumps(status).encode())
        os._exit(REFUSED_EXIT)
    uid = cfg.get("uid")
    prog_ids, test_ids = (uid, cfg.get("gid")), (cfg.get("tester_uid"), cfg.get("tester_gid"))
    python = cfg["python"] if reachable(cfg["python"], uid) else (cfg.get("python_fallback") or cfg["python"])
    status["interpreter"] = python
    status["user"] = (f"uid {uid}" if uid is not None else "uid 0 of a user namespace, no capabilities"
                      if os.getuid() == 0 else f"uid {os.getuid()} (not root: kept)")
    if cfg["mode"] == "tests":
        status["tester_user"] = f"uid {test_ids[0]}" if test_ids[0] is not None else status["user"]
    env = dict(ENV, FORERUN_SANDBOX_NET=status.get("network", "blocked"))
    os.write(fd["status"], json.dumps(status).encode())
    os.close(fd["status"])
    here = "sandbox_inside.py"  # relative to each process's cwd: its directory's ancestors need not be open
    if cfg["mode"] == "plain":
        c_env = dict(env, HOME=cfg["workdir"], TMPDIR=cfg["workdir"])
        watch = {spawn(cfg, [python, "-I", here, "plain", "program.py"], {0: 0, 1: 1, 2: 2}, prog_ids,
                       cfg["workdir"], c_env)}
    else:
        watch = {start_tests(cfg, python, env, prog_ids, test_ids)}
    code = 0
    while watch:
        try:
            pid, st = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid in watch:
            watch.discard(pid)
            code = st
    if not flags & CLONE_NEWPID:
        _kill_descendants()
    _exit_like(code)  # in a pid namespace, our exit kills whatever is left


def main() -> None:
    cfg = json.loads(sys.argv[1])
    die_with_parent(cfg["grader_pid"])
    status: dict = {"isolation": cfg["isolation"], "network": "blocked", "filesystem": "", "pids": "process group"}
    flags = enter_namespaces(status) if cfg["isolation"] == "namespaces" else 0
    if flags & CLONE_NEWNS:
        try:
            protect_filesystem(os.path.realpath(cfg["workdir"]), cfg["expose"], cfg["stage"], status, cfg)
        except OSError as e:
            status["filesystem"] = ""
            status["filesystem_error"] = str(e)
    os.chdir(cfg["workdir"])
    launcher = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            pid1(cfg, status, flags, launcher)
        except BaseException as e:  # noqa: BLE001
            os.write(2, f"sandbox: pid 1 failed: {e}\n".encode())
        os._exit(126)
    for f in cfg["fds"].values():
        os.close(f)
    _, st = os.waitpid(pid, 0)
    _exit_like(st)


if __name__ == "__main__":
    main()
