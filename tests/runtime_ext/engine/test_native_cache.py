"""The native kernels' build cache (issue 28, item 5): keyed by the source and the flags, never by the checkout;
one builder at a time through a lock that notices a dead owner; a timeout that names the owner; one line of
notice when it builds.

The cache logic is exercised with a tiny C extension compiled by `cc` in a fraction of a second (a real kernel
build takes about a minute); the real kernels are checked to live where their key says, built from the cache's
own copy of the source.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import pytest

from forerun.runtime_ext.engine import native
from forerun.runtime_ext.engine.native import BuildLock, KernelBuildTimeout, KernelSpec, cache_folder, load_cached

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler")

PROBE_C = textwrap.dedent("""\
    #include <Python.h>
    static struct PyModuleDef probe = {PyModuleDef_HEAD_INIT, "forerun_probe", NULL, -1, NULL, NULL, NULL, NULL, NULL};
    PyMODINIT_FUNC PyInit_forerun_probe(void) { return PyModule_Create(&probe); }
""")


def checkout(root: Path) -> KernelSpec:
    """A 'checkout' holding its own copy of the probe source."""
    (root / "csrc").mkdir(parents=True)
    source = root / "csrc" / "probe.c"
    source.write_text(PROBE_C)
    return KernelSpec(name="forerun_probe", source=source, cflags=("-O1",))


class CountingCompiler:
    """Compiles the folder's copy of the source with cc; counts builds; refuses to build over a leftover torch
    `lock` file (where torch's own builder would wait forever)."""

    def __init__(self) -> None:
        self.builds: list[Path] = []

    def __call__(self, spec: KernelSpec, folder: Path):
        assert not (folder / "lock").exists(), "a stale torch lock file was left in the build folder"
        src = folder / spec.source.name
        assert src.read_text() == Path(spec.source).read_text()
        lib = folder / f"{spec.name}{sysconfig.get_config_var('EXT_SUFFIX')}"
        subprocess.run([CC, "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", *spec.cflags, str(src),
                        "-o", str(lib)], check=True)
        self.builds.append(folder)
        module_spec = importlib.util.spec_from_file_location(spec.name, lib)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return module, lib.name


def test_two_checkouts_share_one_build(tmp_path):
    a, b = checkout(tmp_path / "checkout-a"), checkout(tmp_path / "checkout-b")
    cache, cc = tmp_path / "cache", CountingCompiler()
    assert a.key() == b.key() and cache_folder(a, cache) == cache_folder(b, cache)
    for i, spec in enumerate((a, b, a, b)):  # used alternately
        module = load_cached(spec, base=cache, compile=cc, notice=None)
        assert module.__name__ == "forerun_probe"
        if i:  # loaded from the one cache folder (the first built it in its work folder, then renamed it)
            assert Path(module.__file__).parent == cache_folder(spec, cache)
    assert len(cc.builds) == 1  # built once, by the first; loaded by the rest
    folder = cache_folder(a, cache)
    assert json.loads((folder / "complete.json").read_text())["key"] == a.key()
    assert not any(str(tmp_path / "checkout-a") in p.read_text(errors="ignore") for p in folder.iterdir()
                   if p.suffix in (".c", ".json", ".ninja"))


def test_the_key_follows_the_source_and_the_flags_not_the_path(tmp_path):
    a = checkout(tmp_path / "a")
    assert KernelSpec(a.name, a.source, ("-O2",)).key() != a.key()
    changed = checkout(tmp_path / "b")
    changed.source.write_text(PROBE_C + "\n/* edited */\n")
    assert changed.key() != a.key()
    # the real kernels: a copy of their source elsewhere has the same key and cache folder
    copy = tmp_path / "elsewhere" / "forerun_kernels.cpp"
    copy.parent.mkdir()
    shutil.copyfile(native.kernel_spec().source, copy)
    real = native.kernel_spec()
    moved = KernelSpec(real.name, copy, real.cflags, real.ldflags)
    assert moved.key() == real.key() and cache_folder(moved) == cache_folder(real)


def test_the_build_says_so_in_one_line_and_a_cached_load_says_nothing(tmp_path):
    spec, cc = checkout(tmp_path / "co"), CountingCompiler()
    out = io.StringIO()
    load_cached(spec, base=tmp_path / "cache", compile=cc, notice=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and "building native kernels (first run" in lines[0]
    out = io.StringIO()
    load_cached(spec, base=tmp_path / "cache", compile=cc, notice=out)
    assert out.getvalue() == "" and len(cc.builds) == 1


def test_a_stale_lock_and_an_unfinished_build_from_a_dead_process_are_recovered(tmp_path):
    spec, cc, cache = checkout(tmp_path / "co"), CountingCompiler(), tmp_path / "cache"
    folder = cache_folder(spec, cache)
    folder.mkdir(parents=True)
    (folder / "lock").write_text("")  # torch's own baton, left by a build killed mid-way
    (folder / "probe.o").write_bytes(b"half an object file")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = folder.with_name(folder.name + ".lock")
    lock.write_text(f"{dead.pid} {os.uname().nodename} 0\n")
    t0 = time.monotonic()
    module = load_cached(spec, base=cache, compile=cc, notice=None, timeout_s=30)
    assert module.__name__ == "forerun_probe" and len(cc.builds) == 1 and time.monotonic() - t0 < 20
    assert not (folder / "probe.o").exists() and not (folder / "lock").exists()  # the leftovers are gone


def test_the_pid_file_lock_takes_over_from_a_dead_owner_and_times_out_on_a_live_one(tmp_path):
    path = tmp_path / "x.lock"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path.write_text(f"{dead.pid} {os.uname().nodename} 0\n")
    with BuildLock(path, timeout_s=10, what="test", use_flock=False):
        assert path.read_text().split()[0] == str(os.getpid())
    assert not path.exists()
    path.write_text(f"{os.getpid()} {os.uname().nodename} 0\n")  # alive: this process
    with pytest.raises(KernelBuildTimeout, match=f"process {os.getpid()}"):
        with BuildLock(path, timeout_s=0.5, what="test", use_flock=False):
            pass


def test_a_live_builder_is_waited_for_with_a_notice_then_a_clear_timeout(tmp_path):
    path = tmp_path / "y.lock"
    with BuildLock(path, timeout_s=5, what="the kernels"):
        out = io.StringIO()
        t0 = time.monotonic()
        with pytest.raises(KernelBuildTimeout, match=f"waited 1 s for process {os.getpid()} on .* building the kernels"):
            with BuildLock(path, timeout_s=1, what="the kernels", notice=out):
                pass
        assert 0.9 < time.monotonic() - t0 < 10
        assert out.getvalue().count("\n") == 1 and f"waiting for process {os.getpid()}" in out.getvalue()
    with BuildLock(path, timeout_s=1, what="the kernels"):  # released: free again
        pass


BUILDER = textwrap.dedent("""\
    import importlib.util, sys, time
    from pathlib import Path
    spec_ = importlib.util.spec_from_file_location("native_under_test", sys.argv[1])
    native = sys.modules["native_under_test"] = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(native)

    def slow(spec, folder):
        (folder / "lock").write_text("")  # what torch.utils.cpp_extension holds while it builds
        (folder / "partial.o").write_bytes(b"...")
        time.sleep(120)

    native.load_cached(native.KernelSpec("forerun_probe", Path(sys.argv[2]), ("-O1",)), base=Path(sys.argv[3]),
                       compile=slow)
""")


def test_kill_9_during_a_build_then_a_rerun_completes(tmp_path):
    spec, cc, cache = checkout(tmp_path / "co"), CountingCompiler(), tmp_path / "cache"
    script = tmp_path / "builder.py"
    script.write_text(BUILDER)
    proc = subprocess.Popen([sys.executable, str(script), native.__file__, str(spec.source), str(cache)],
                            stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()  # the build notice: the builder holds the lock and is building now
    assert "building native kernels" in line
    time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    proc.stderr.close()
    folder = cache_folder(spec, cache)
    left = folder.with_name(f"{folder.name}.build-{proc.pid}")
    assert (left / "lock").exists() and not folder.exists()  # a killed build leaves its lock, never a folder
    t0 = time.monotonic()
    module = load_cached(spec, base=cache, compile=cc, notice=None, timeout_s=30)
    assert module.__name__ == "forerun_probe" and len(cc.builds) == 1 and time.monotonic() - t0 < 20
    assert not left.exists() and (folder / "complete.json").is_file()


def test_the_real_kernels_load_from_their_keyed_folder_built_from_its_own_copy():
    k = native.kernels()
    if k is None:
        pytest.skip(f"native kernels unavailable: {native.unavailable_reason()}")
    spec = native.kernel_spec()
    folder = cache_folder(spec)
    loaded_from = Path(k.__file__).parent  # the folder, or the work folder it was built in by this process
    assert loaded_from == folder or loaded_from.name.startswith(folder.name + ".build-")
    assert (folder / "complete.json").is_file()
    assert (folder / spec.source.name).read_bytes() == spec.source.read_bytes()
    ninja = folder / "build.ninja"
    if ninja.is_file():  # the build files name the cache's copy of the source, never the checkout's
        assert str(spec.source) not in ninja.read_text()
