"""The SGLang frontend imports without triton/torch; exactly two modules import sglang:
`runtime_ext/backends/sglang_frontend.py` (the frontend, `sglang` / `sglang.lang`) and
`runtime_ext/backends/sglang_plugin.py` (the server plugin, `sglang.srt` only, inside its entry point)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PACKAGE_FOLDERS = ("forerun_pkg", "programs", "runtime_ext", "classifiers", "eval", "cli", "testing")
FRONTEND = REPO / "runtime_ext" / "backends" / "sglang_frontend.py"
PLUGIN = REPO / "runtime_ext" / "backends" / "sglang_plugin.py"
_SGLANG_IMPORT = re.compile(r"^\s*(import\s+sglang\b|from\s+sglang\b)", re.MULTILINE)


def test_frontend_imports_without_triton_or_torch():
    # `sys.modules[name] = None` makes `import name` fail and `find_spec(name)` return None, as on a machine
    # where neither is installed: the frontend (sglang.lang) must not need them.
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None
        sys.modules["triton"] = None
        from forerun.runtime_ext.backends.sglang_frontend import sgl, function, gen, select, BaseBackend, StreamExecutor
        from forerun.runtime_ext.backends.sglang_frontend import SglSamplingParams, set_default_backend
        assert callable(function) and callable(gen) and callable(select)
        loaded = [m for m, v in sys.modules.items() if v is not None and m.split(".")[0] in ("torch", "triton")]
        assert not loaded, f"torch/triton got imported: {loaded[:5]}"
        print("ok")
        """
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().endswith("ok")


def test_only_the_frontend_module_imports_sglang():
    offenders = []
    for folder in PACKAGE_FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            if path.resolve() == FRONTEND.resolve():
                continue
            for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if _SGLANG_IMPORT.match(line):
                    offenders.append(f"{path.relative_to(REPO)}:{lineno}: {line.strip()}")
    assert not offenders, (
        "only runtime_ext/backends/sglang_frontend.py may import sglang (the runtime plugin too takes its names "
        "from there); import from forerun.runtime_ext.backends.sglang_frontend instead:\n" + "\n".join(offenders)
    )
    assert _SGLANG_IMPORT.search(FRONTEND.read_text(encoding="utf-8"))


def test_the_plugin_reaches_the_runtime_only_inside_its_entry_point():
    """sglang_plugin.py imports nothing of sglang at module level (importing it without the runtime costs
    nothing): its entry point takes the runtime's hook registry from the one import point, whose
    `hook_registry()` imports `sglang.srt` only when called; nothing imports the plugin module but SGLang."""
    import ast

    tree = ast.parse(PLUGIN.read_text(encoding="utf-8"))
    top_level = [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not [t for t in top_level if "sglang" in t], f"sglang reached at module level: {top_level}"
    register = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "register")
    inner = [ast.unparse(n) for n in ast.walk(register) if isinstance(n, ast.ImportFrom)]
    assert inner == ["from .sglang_frontend import hook_registry"], inner
    front = ast.parse(FRONTEND.read_text(encoding="utf-8"))
    hook = next(n for n in front.body if isinstance(n, ast.FunctionDef) and n.name == "hook_registry")
    assert [ast.unparse(n) for n in ast.walk(hook) if isinstance(n, ast.ImportFrom)] == \
        ["from sglang.srt.plugins.hook_registry import HookRegistry, HookType"]
    assert not [ast.unparse(n) for n in front.body if isinstance(n, ast.ImportFrom) and "sglang.srt" in (n.module or "")]
    users = [p for f in PACKAGE_FOLDERS for p in (REPO / f).rglob("*.py")
             if p.resolve() != PLUGIN.resolve()
             and re.search(r"^\s*(from\s+\S*sglang_plugin\b|import\s+\S*sglang_plugin\b|from\s+\.+\S*\s+import\s+.*\bsglang_plugin\b)",
                           p.read_text(encoding="utf-8"), re.M)]
    assert not users, f"production modules import the server plugin: {users}"
