"""The one place forerun imports the SGLang frontend.

`import sglang` runs `sglang.srt.utils.hf_transformers_patches.apply_all()`, which imports torch and
triton; the frontend (`sglang.lang`) needs neither.  When the SGLang *runtime* is not installed (CPU
machines: sglang installed with ``--no-deps``, no triton), a no-op module is registered under that name
before the import so that the frontend imports cleanly.  When the runtime is installed (GPU machines),
sglang is imported untouched.

Everything else in forerun takes SGLang names from here, never from ``sglang`` directly (the server-side
plugin too: `hook_registry()` imports the runtime's hook registry, which exists only where the runtime is).
"""

from __future__ import annotations

import importlib.util
import sys
import types

_PATCH_MODULE = "sglang.srt.utils.hf_transformers_patches"


def runtime_installed() -> bool:
    """True when the SGLang runtime's GPU stack (triton) is importable, i.e. the real patches can run."""
    return importlib.util.find_spec("triton") is not None


if _PATCH_MODULE not in sys.modules and not runtime_installed():
    _stub = types.ModuleType(_PATCH_MODULE)
    _stub.apply_all = lambda: None  # type: ignore[attr-defined]
    _stub.__doc__ = "forerun stub: the SGLang runtime is not installed; the frontend needs no patches."
    sys.modules[_PATCH_MODULE] = _stub

import sglang as sgl  # noqa: E402
from sglang.lang.backend.base_backend import BaseBackend  # noqa: E402
from sglang.lang.choices import ChoicesDecision, ChoicesSamplingMethod, token_length_normalized  # noqa: E402
from sglang.lang.interpreter import ProgramState, StreamExecutor  # noqa: E402
from sglang.lang.ir import SglSamplingParams  # noqa: E402



def hook_registry() -> tuple[type, type]:
    """(HookRegistry, HookType) of the SGLang runtime's plugin system (`sglang.srt.plugins`); only importable in
    a server process, where the runtime is installed."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    return HookRegistry, HookType


function = sgl.function
gen = sgl.gen
select = sgl.select
set_default_backend = sgl.set_default_backend
system = sgl.system
user = sgl.user
assistant = sgl.assistant

__all__ = [
    "BaseBackend",
    "ChoicesDecision",
    "ChoicesSamplingMethod",
    "ProgramState",
    "SglSamplingParams",
    "StreamExecutor",
    "assistant",
    "function",
    "gen",
    "runtime_installed",
    "select",
    "set_default_backend",
    "sgl",
    "system",
    "token_length_normalized",
    "user",
]
