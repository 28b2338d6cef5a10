"""The one place forerun imports the SGLang frontend.

`import sglang` runs `sglang.srt.utils.hf_transformers_patches.apply_all()`, which imports the runtime's
utilities (`srt/utils/common.py`: torch, triton, orjson, psutil, PIL, starlette, ...); the frontend
(`sglang.lang`) needs none of them.  When the SGLang *runtime* is installed (GPU machines: `FORERUN_GPU=1
scripts/setup`), sglang is imported untouched.  Otherwise (CPU machines: sglang installed with ``--no-deps``),
a no-op module is registered under that name first (`sglang_stub`; in a venv made by scripts/setup already at
interpreter start, so that users' own `import sglang` works too) so that the frontend imports cleanly - also where triton
is present without the rest of the runtime (a CUDA torch wheel brings triton along, and the real patches then
fail on `import orjson`): the real import is tried, and on ImportError the half-imported sglang modules are
dropped and the stub is used.  The frontend itself needs only what forerun declares (pybase64, ipython,
pydantic, aiohttp, msgspec, numpy, requests, tqdm).

Everything else in forerun takes SGLang names from here, never from ``sglang`` directly (the server-side
plugin too: `hook_registry()` imports the runtime's hook registry, which exists only where the runtime is).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

from .sglang_stub import PATCH_MODULE, is_stub, register_stub


def _import_runtime_patches() -> bool:
    """Import sglang with its real patches; False (and sglang's half-imported modules dropped) when the
    runtime's imports are not all installed."""
    try:
        importlib.import_module("sglang")
    except ImportError:
        for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
            del sys.modules[name]
        return False
    return True


_RUNTIME = False
if PATCH_MODULE not in sys.modules:
    _RUNTIME = importlib.util.find_spec("triton") is not None and _import_runtime_patches()
    if not _RUNTIME:
        register_stub()
else:
    _RUNTIME = not is_stub(sys.modules[PATCH_MODULE])


def runtime_installed() -> bool:
    """True when sglang was imported with its real runtime patches (the SGLang runtime is installed)."""
    return _RUNTIME

import sglang as sgl  # noqa: E402
from sglang.lang.backend.base_backend import BaseBackend  # noqa: E402
from sglang.lang.choices import ChoicesDecision, ChoicesSamplingMethod, token_length_normalized  # noqa: E402
from sglang.lang.interpreter import ProgramState, StreamExecutor  # noqa: E402
from sglang.lang.ir import SglSamplingParams  # noqa: E402



def refuse_kept_special_tokens() -> None:
    """Refuse `sgl.global_config.skip_special_tokens_in_output = False`: SGLang's RuntimeEndpoint sends it as the
    request's `skip_special_tokens` (lang/backend/runtime_endpoint.py, `generate` / `generate_stream`), so the gen's
    text keeps special tokens there; forerun's backends always return the text with special tokens skipped (their
    stop trimming and remembered ids are built on it), so the setting would be silently ignored."""
    if not sgl.global_config.skip_special_tokens_in_output:
        raise NotImplementedError("sgl.global_config.skip_special_tokens_in_output = False: forerun backends return "
                                  "the generated text with special tokens skipped (SGLang's default); set it back "
                                  "to True, or read the token ids from meta_info (return_logprob=True)")


def hook_registry() -> tuple[type, type]:
    """(HookRegistry, HookType) of the SGLang runtime's plugin system (`sglang.srt.plugins`); only importable in
    a server process, where the runtime is installed."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    return HookRegistry, HookType


def generate_contract_error(body: object) -> str | None:
    """What SGLang's HTTP server refuses in a parsed `/generate` body before anything runs (its JSON schema gate,
    `srt/entrypoints/api_contract.py`, answered 400 {"error": <this text>}), None when the body passes or this
    sglang has no such gate."""
    try:
        from sglang.api.v1.api_types import GenerateRequest, JsonContractError
    except ImportError:  # an sglang without the contract module
        return None
    try:
        GenerateRequest.from_json_value(body)
    except JsonContractError as exc:
        return str(exc)
    return None


def named_chat_template(name: str) -> Any:
    """SGLang's chat template registered as `name` (sglang.lang.chat_template); a ValueError naming the registered
    ones for an unknown name (SGLang's own lookup raises a bare KeyError)."""
    templates = sgl.lang.chat_template  # loaded with BaseBackend's import above
    if name not in templates.chat_template_registry:
        raise ValueError(f"unknown chat template {name!r}; SGLang registers: "
                         f"{', '.join(sorted(templates.chat_template_registry))}")
    return templates.get_chat_template(name)


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
    "generate_contract_error",
    "named_chat_template",
    "refuse_kept_special_tokens",
    "runtime_installed",
    "select",
    "set_default_backend",
    "sgl",
    "system",
    "token_length_normalized",
    "user",
]

