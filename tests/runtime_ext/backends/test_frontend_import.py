"""The SGLang frontend imports with and without triton: a CUDA torch wheel brings triton along without the rest
of SGLang's runtime (orjson, psutil, starlette, ...), and the real runtime patches then fail to import; forerun
must fall back to its stub instead of failing (issue 29)."""

from __future__ import annotations

import subprocess
import sys

PROBE = ("import forerun.runtime_ext.backends.sglang_frontend as f, sys; "
         "print(f.runtime_installed(), 'sglang.lang.api' in sys.modules, f.gen is not None)")


def _run(tmp_path, with_triton: bool, block_orjson: bool) -> subprocess.CompletedProcess:
    paths = []
    if with_triton:
        (tmp_path / "triton").mkdir()
        (tmp_path / "triton" / "__init__.py").write_text("__version__ = '0.0-fake'\n")
        paths.append(str(tmp_path))
    if block_orjson:  # a site without orjson, whatever this machine has
        (tmp_path / "block").mkdir()
        (tmp_path / "block" / "orjson.py").write_text("raise ImportError('no orjson here')\n")
        paths.append(str(tmp_path / "block"))
    code = f"import sys; sys.path[:0] = {paths!r}; " + PROBE
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_frontend_imports_without_triton(tmp_path):
    res = _run(tmp_path, with_triton=False, block_orjson=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["False", "True", "True"]


def test_frontend_imports_with_triton_but_not_the_rest_of_the_runtime(tmp_path):
    res = _run(tmp_path, with_triton=True, block_orjson=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["False", "True", "True"]


def test_a_users_own_import_sglang_runs_in_this_interpreter():
    """A program that starts with `import sglang as sgl` (not through forerun) imports and defines its
    functions: in a venv made by scripts/setup, the startup line registers the stub where the runtime is
    missing (without it, CPU machines fail on `import orjson`)."""
    code = ("import sglang as sgl\n@sgl.function\ndef f(s):\n    s += 'hi' + sgl.gen('x', max_tokens=1)\n"
            "print(type(f).__name__)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["SglFunction"]


def test_the_startup_hook_registers_the_stub_only_where_the_runtime_is_missing(monkeypatch):
    import importlib.util

    from forerun.runtime_ext.backends import sglang_stub as stub

    real = importlib.util.find_spec
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    known = {"sglang", *stub.RUNTIME_MODULES}
    present = set(known)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: (object() if n in present else None) if n in known else real(n, *a))
    assert stub.install_at_startup() is False and stub.PATCH_MODULE not in sys.modules  # the runtime is there
    present.discard("orjson")
    assert stub.install_at_startup() is True and stub.is_stub(sys.modules[stub.PATCH_MODULE])
    monkeypatch.delitem(sys.modules, stub.PATCH_MODULE)
    present.discard("sglang")
    assert stub.install_at_startup() is False and stub.PATCH_MODULE not in sys.modules  # no sglang at all
