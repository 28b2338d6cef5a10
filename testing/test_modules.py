"""Loading a helper module that sits beside a test file (pytest runs with --import-mode=importlib, so test
folders are not on sys.path): `sibling(__file__, "sglang_source")`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def sibling(test_file: str, name: str) -> ModuleType:
    """The module `name`.py in the folder of `test_file`, loaded once per process (kept in sys.modules)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(test_file).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None, f"no module {name}.py beside {test_file}"
    module = sys.modules.setdefault(name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module
