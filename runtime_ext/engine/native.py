"""The engine's native CPU kernels (`csrc/forerun_kernels.cpp`): built once with torch.utils.cpp_extension,
cached, loaded on first use.

    kernel                 what it computes (see the C++ file's header for the fixed reduction orders)
    pack([W..])            a call's weight matrices concatenated along the outputs, in panels of 16 outputs
    linear(x, packed, b)   y = x W^T + b; the packed weights are read once per call for all rows
    rmsnorm(h, add, w)     h += add (in place), y = w * h / sqrt(mean(h^2) + eps)
    silu_mul(gu)           silu(gate) * up
    pack_pairs(Wg, Wu)     an MLP's gate and up matrices, their panels alternating
    linear_silu(x, pairs)  silu(x Wg^T) * (x Wu^T), silu applied by each thread to the panels it has just computed
    attention(...)         RoPE, KV write into the buffer, per-query softmax attention over its own keys
    vocab_stats(logits)    per row: max, log Σ exp(l - max), entropy, all finite
    draw(...)              inverse-CDF draws from q_τ in token order
    stream_read(x, streams) one pass over a tensor, each thread in interleaved runs (the bandwidth probe of
                           `forerun bench engine`)
    fma_peak(iters)        register-only multiply-adds on every thread (its compute probe)

Each result of a row is the same sequence of IEEE operations whatever else is in the call, so the engine is
batch-invariant in every dtype it runs.  The ISA flags are part of the extension's name (an AVX-512 build is
never loaded on a machine without it); the portable C++ path gives the same bits as the vector one (AVX-512, or
AVX2 + FMA + F16C: the same 16 lanes in two registers).
Without a C++ compiler, `kernels()` returns None and the engine falls back to its transformers path.

The build cache ($TORCH_EXTENSIONS_DIR, else ~/.cache/forerun/kernels) is keyed by what the binary depends on,
never by where a checkout lives:

    notion                                   code
    what a build depends on                  KernelSpec: module name, source, compiler flags
    its cache key                            KernelSpec.key(): sha256 of the source text, the flags, torch's
                                             version, the Python ABI, the machine and $CXX
    its folder                               cache_folder(spec) = <cache>/<name>-<key>
    a finished build                         <folder>/complete.json, written last (atomically): loaded directly
    one builder at a time                    BuildLock on <folder>.lock: an flock the kernel releases when its
                                             owner dies (kill -9 included); where flock is unsupported, a pid
                                             file whose dead owner is noticed; a timeout with the owner's pid

The source is copied into the cache and compiled there, so the build files name only the cache: every checkout
with the same source and flags loads the same build without rebuilding.  A build runs in its own work folder
(<folder>.build-<pid>) that becomes <folder> by one rename once it is complete, so a build killed mid-way (its
compiler may outlive it) never touches <folder>; the next builder removes what dead builders left (torch's own
`lock` file with it) and builds again.  Building prints one line on stderr ("building native kernels (first
run)").
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import json
import logging
import os
import platform
import shutil
import socket
import sys
import sysconfig
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, TextIO, TypeVar

import torch

try:
    import fcntl
except ImportError:  # no flock here (Windows): BuildLock uses its pid file
    fcntl = None  # type: ignore[assignment]

_SOURCE = Path(__file__).with_name("csrc") / "forerun_kernels.cpp"
_LOCK = threading.Lock()
_STATE: dict[str, Any] = {}
log = logging.getLogger(__name__)
T = TypeVar("T")

_ISA_FLAGS = {
    "avx512": ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "portable": [],
}
# -falign-loops=64: the linear tiles' loops (~120 bytes) then start on a cache line; unaligned, the 20-row forward
# measured ~13 % slower on Zen 3 (2026-12-02), from where the loops happened to land.
_BASE_CFLAGS = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-falign-loops=64", "-fopenmp"]
_LDFLAGS = ["-fopenmp"]
COMPLETE = "complete.json"
LOCK_TIMEOUT_S = 900.0
"""Default wait for another process's build (FORERUN_KERNEL_LOCK_TIMEOUT overrides it, in seconds)."""


def isa() -> str:
    """The instruction set the kernels are built for on this machine (torch's own CPU capability)."""
    cap = str(torch.backends.cpu.get_cpu_capability()).upper()
    if cap.startswith("AVX512"):
        return "avx512"
    return "avx2" if cap.startswith("AVX2") else "portable"


def build_directory() -> Path:
    """The kernel cache shared by every checkout ($TORCH_EXTENSIONS_DIR, else ~/.cache/forerun/kernels)."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "forerun" / "kernels"


@dataclass(frozen=True)
class KernelSpec:
    """What one build of an extension depends on (its cache key) and how to name it."""

    name: str
    """The extension module's name (its PyInit_ symbol)."""
    source: Path
    cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()

    def key(self) -> str:
        """16 hex digits of sha256 over the source text, the flags and the toolchain the binary depends on."""
        h = hashlib.sha256()
        parts = [self.name, *self.cflags, "|", *self.ldflags, "|", torch.__version__, sys.implementation.cache_tag or "",
                 str(sysconfig.get_config_var("EXT_SUFFIX")), platform.machine(), os.environ.get("CXX", "c++")]
        h.update("\0".join(parts).encode())
        h.update(b"\0")
        h.update(Path(self.source).read_bytes())
        return h.hexdigest()[:16]


def kernel_spec(target: str | None = None) -> KernelSpec:
    """This machine's kernels: csrc/forerun_kernels.cpp with the flags of its ISA."""
    target = target or isa()
    return KernelSpec(name=f"forerun_kernels_{target}", source=_SOURCE,
                      cflags=tuple(_BASE_CFLAGS + _ISA_FLAGS[target]), ldflags=tuple(_LDFLAGS))


def cache_folder(spec: KernelSpec, base: Path | None = None) -> Path:
    """<cache>/<name>-<key>: the same for every checkout whose source and flags are the same."""
    return (base if base is not None else build_directory()) / f"{spec.name}-{spec.key()}"


class KernelBuildTimeout(RuntimeError):
    """Another process held the build lock for longer than the timeout."""


class BuildLock:
    """One builder per cache folder across processes (see the module docstring).

    `flock` on the lock file: the kernel drops it when the owner exits or is killed, so a dead owner never
    blocks.  Where flock is unsupported the file itself is the lock (created exclusively, holding
    "pid host"); a file whose pid is not alive on this host is stale and taken over.  Waits at most
    `timeout_s`, saying once on `notice` whom it waits for, then raises KernelBuildTimeout naming the owner.
    """

    def __init__(self, path: Path, *, timeout_s: float, what: str, notice: TextIO | None = None,
                 use_flock: bool | None = None) -> None:
        self.path = Path(path)
        self.timeout_s = timeout_s
        self.what = what
        self.notice = notice
        self.use_flock = fcntl is not None if use_flock is None else use_flock
        self._fd: int | None = None
        self._owns_file = False

    def __enter__(self) -> "BuildLock":
        deadline = time.monotonic() + self.timeout_s
        announced = False
        while not self._try_acquire():
            if time.monotonic() >= deadline:
                raise KernelBuildTimeout(
                    f"waited {self.timeout_s:.0f} s for {self.owner()} building {self.what} (lock {self.path}); "
                    "if that process is stuck, end it or delete the lock file; FORERUN_NATIVE=0 skips the kernels, "
                    "FORERUN_KERNEL_LOCK_TIMEOUT sets the wait")
            if not announced and self.notice is not None:
                print(f"forerun: waiting for {self.owner()} building {self.what}", file=self.notice, flush=True)
                announced = True
            time.sleep(0.2)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._fd is not None:
            if self.use_flock:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if self._owns_file:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
            self._owns_file = False

    def owner(self) -> str:
        """"process <pid> on <host>" as the lock file says (or "another process")."""
        try:
            pid, host = self.path.read_text().split()[:2]
            return f"process {int(pid)} on {host}"
        except (OSError, ValueError):
            return "another process"

    def _stamp(self) -> bytes:
        return f"{os.getpid()} {socket.gethostname()} {int(time.time())}\n".encode()

    def _try_acquire(self) -> bool:
        if self.use_flock:
            try:
                return self._try_flock()
            except OSError as exc:  # no flock on this file system: the pid file below
                if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    raise
                self.use_flock = False
        return self._try_pid_file()

    def _try_flock(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, self._stamp())
        self._fd = fd
        return True

    def _try_pid_file(self) -> bool:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if self._stale():
                try:
                    self.path.unlink()
                except FileNotFoundError:
                    pass
            return False
        os.write(fd, self._stamp())
        os.close(fd)
        self._owns_file = True
        return True

    def _stale(self) -> bool:
        """The pid file names a process of this host that is no longer alive (or holds nothing readable and
        is older than a minute)."""
        try:
            pid_text, host = self.path.read_text().split()[:2]
            pid = int(pid_text)
        except (OSError, ValueError):
            try:
                return time.time() - self.path.stat().st_mtime > 60
            except OSError:
                return False
        return host == socket.gethostname() and not pid_alive(pid)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


Compile = Callable[[KernelSpec, Path], "tuple[ModuleType, str]"]
"""`compile(spec, folder)`: build spec's source (already copied into `folder`) there; returns (the loaded module,
the library's file name in `folder`)."""


def torch_compile(spec: KernelSpec, folder: Path) -> tuple[ModuleType, str]:
    """torch.utils.cpp_extension.load on the folder's copy of the source, built in the folder."""
    from torch.utils.cpp_extension import load

    module = load(name=spec.name, sources=[str(folder / spec.source.name)], extra_cflags=list(spec.cflags),
                  extra_ldflags=list(spec.ldflags), build_directory=str(folder), verbose=False)
    library = Path(getattr(module, "__file__", None) or folder / f"{spec.name}.so").name
    return module, library


def load_cached(spec: KernelSpec, *, base: Path | None = None, compile: Compile = torch_compile,
                timeout_s: float | None = None, notice: TextIO | None | str = "stderr") -> ModuleType:
    """The extension `spec` from the shared cache: loaded directly when a complete build is there, else built
    once (under the folder's BuildLock; one line on `notice`, sys.stderr by default, None: silent) and marked
    complete."""
    if notice == "stderr":
        notice = sys.stderr
    assert notice is None or not isinstance(notice, str)
    folder = cache_folder(spec, base)
    module = _load_complete(folder, spec)
    if module is not None:
        return module
    if timeout_s is None:
        timeout_s = float(os.environ.get("FORERUN_KERNEL_LOCK_TIMEOUT", LOCK_TIMEOUT_S))
    folder.parent.mkdir(parents=True, exist_ok=True)
    with BuildLock(folder.with_name(folder.name + ".lock"), timeout_s=timeout_s, what=f"native kernels in {folder}",
                   notice=notice):
        module = _load_complete(folder, spec)  # built by the process we waited for
        if module is not None:
            return module
        _remove_leftovers(folder)
        work = folder.with_name(f"{folder.name}.build-{os.getpid()}")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        shutil.copyfile(spec.source, work / spec.source.name)
        if notice is not None:
            print(f"forerun: building native kernels (first run, about a minute): {folder}", file=notice, flush=True)
        module, library = compile(spec, work)
        marker = {"key": spec.key(), "name": spec.name, "library": library, "built": int(time.time())}
        (work / COMPLETE).write_text(json.dumps(marker))
        os.replace(work, folder)  # complete, in one step (this process keeps the module it loaded from `work`)
        return module


def _remove_leftovers(folder: Path) -> None:
    """Under the build lock: an incomplete <folder> and the work folders of builders that are gone."""
    if folder.exists():
        shutil.rmtree(folder)
    for work in folder.parent.glob(f"{folder.name}.build-*"):
        pid = work.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or not pid_alive(int(pid)) or int(pid) == os.getpid():
            shutil.rmtree(work, ignore_errors=True)  # its orphaned compiler may still write: errors ignored


def _load_complete(folder: Path, spec: KernelSpec) -> ModuleType | None:
    """The module of a complete build in `folder`, or None (no build, an unfinished one, or one that does not
    load: it is then rebuilt)."""
    try:
        marker = json.loads((folder / COMPLETE).read_text())
    except (OSError, ValueError):
        return None
    library = folder / str(marker.get("library", ""))
    if marker.get("key") != spec.key() or not library.is_file():
        return None
    try:
        module_spec = importlib.util.spec_from_file_location(spec.name, library)
        if module_spec is None or module_spec.loader is None:
            return None
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    except (ImportError, OSError) as exc:
        log.warning("cached native kernels in %s do not load (%s); rebuilding", folder, exc)
        return None
    return module


def kernels() -> Any | None:
    """The loaded extension module (built on first call, ~1 min, into the shared cache; loaded from it afterwards),
    or None when it cannot be built here (the reason is logged once and kept in `unavailable_reason()`).
    FORERUN_NATIVE=0 disables it."""
    with _LOCK:
        if "module" in _STATE:
            return _STATE["module"]
        module = None
        if os.environ.get("FORERUN_NATIVE", "1") == "0":
            _STATE["reason"] = "disabled by FORERUN_NATIVE=0"
        else:
            try:
                module = load_cached(kernel_spec())
            except Exception as exc:  # no compiler, no headers, a failed build, a lock timeout: the engine falls back
                _STATE["reason"] = f"{type(exc).__name__}: {exc}"
                log.warning("forerun native kernels unavailable (%s); using the transformers path", _STATE["reason"])
        _STATE["module"] = module
        return module


def on_transient_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """fn(*args, **kwargs) on a new thread that ends with it; returns its result or re-raises its exception.

    torch's OpenMP runtime (libgomp) gives every thread that runs a parallel region a worker pool of its own, kept
    for the thread's life, and with more pooled threads than cores its workers stop spinning between regions, so
    each region pays a futex wake-up.  The engine decodes on its scheduler thread; measured on 2 cores, a
    transformers `generate` on the main thread left the engine's later decode steps 2.5x slower (24 -> 62 ms per
    token, float32).  Torch work that is not the engine's (a transformers baseline, a bandwidth probe) runs here,
    so its pool ends with the thread."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="forerun-transient") as one:  # joined on exit
        return one.submit(fn, *args, **kwargs).result()


def with_threads(n: int, fn: Callable[[], T]) -> T:
    """fn() with torch's (and so the kernels') thread count set to n, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def unavailable_reason() -> str | None:
    """Why `kernels()` returned None (None when it loaded or was not tried yet)."""
    return _STATE.get("reason")
