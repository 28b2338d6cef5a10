"""The no-op stand-in for SGLang's runtime patches, so that `import sglang` works where only the frontend is.

`import sglang` first runs `sglang.srt.utils.hf_transformers_patches.apply_all()`, whose module imports the
runtime's utilities (torch, triton, orjson, psutil, starlette, ...); the frontend (`sglang.lang`) needs none of
them.  On a machine with the frontend only (CPU: sglang installed ``--no-deps``) a no-op module registered under
that name first lets the frontend import: Python takes a module already in `sys.modules` without importing its
parent packages.  Two ways in:

* `sglang_frontend` (forerun's one import of the frontend) registers it when the real import fails;
* `install_at_startup()`, run by the ``forerun-sglang-frontend.pth`` line that scripts/setup writes into the
  venv, registers it before any user code where the runtime's modules are not installed, so a user's own
  program that starts with ``import sglang as sgl`` runs unchanged in that venv.  It never imports sglang.
"""

from __future__ import annotations

import importlib.util
import sys
import types

PATCH_MODULE = "sglang.srt.utils.hf_transformers_patches"
STUB_DOC = "forerun stub: the SGLang runtime is not installed; the frontend needs no patches."
RUNTIME_MODULES = ("torch", "triton", "orjson", "psutil", "starlette")
"""Modules the runtime patches' import needs (srt/utils/common.py); any missing: it cannot import."""
PTH_LINE = ('import sys; exec("try:\\n from forerun.runtime_ext.backends.sglang_stub import install_at_startup\\n'
            ' install_at_startup()\\nexcept Exception:\\n pass")\n')
"""The .pth line: `site` executes a line that starts with "import" (hence `import sys`) at every start of the
venv's python; the try makes sure it never fails the start (forerun uninstalled, a broken install)."""


def register_stub() -> None:
    stub = types.ModuleType(PATCH_MODULE)
    stub.apply_all = lambda: None  # type: ignore[attr-defined]
    stub.__doc__ = STUB_DOC
    sys.modules[PATCH_MODULE] = stub


def is_stub(module: types.ModuleType) -> bool:
    return getattr(module, "__doc__", None) == STUB_DOC


def install_at_startup() -> bool:
    """Register the stub when sglang is installed without its runtime and nothing imported it yet (True when
    it did)."""
    if PATCH_MODULE in sys.modules or "sglang" in sys.modules or importlib.util.find_spec("sglang") is None:
        return False
    if all(importlib.util.find_spec(m) is not None for m in RUNTIME_MODULES):
        return False
    register_stub()
    return True
