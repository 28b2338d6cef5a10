"""The SGLang frontend imports without triton/torch, and only `runtime_ext/backends/sglang_frontend.py` imports sglang."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PACKAGE_FOLDERS = ("forerun_pkg", "programs", "runtime_ext", "classifiers", "eval", "cli", "testing")
FRONTEND = REPO / "runtime_ext" / "backends" / "sglang_frontend.py"
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
        "only runtime_ext/backends/sglang_frontend.py may import sglang; import from "
        "forerun.runtime_ext.backends.sglang_frontend instead:\n" + "\n".join(offenders)
    )
    assert _SGLANG_IMPORT.search(FRONTEND.read_text(encoding="utf-8"))
