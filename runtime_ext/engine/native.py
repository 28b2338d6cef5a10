"""The engine's native CPU kernels (`csrc/forerun_kernels.cpp`): built once with torch.utils.cpp_extension,
cached, loaded on first use.

    kernel                 what it computes (see the C++ file's header for the fixed reduction orders)
    pack([W..])            a call's weight matrices concatenated along the outputs, in panels of 16 outputs
    linear(x, packed, b)   y = x W^T + b; the packed weights are read once per call for all rows
    rmsnorm(h, add, w)     h += add (in place), y = w * h / sqrt(mean(h^2) + eps)
    silu_mul(gu)           silu(gate) * up
    attention(...)         RoPE, KV write into the buffer, per-query softmax attention over its own keys
    vocab_stats(logits)    per row: max, log Σ exp(l - max), entropy, all finite
    draw(...)              inverse-CDF draws from q_τ in token order
    stream_read(x)         one pass over a tensor (the memory-bandwidth probe of `forerun bench engine`)
    fma_peak(iters)        register-only multiply-adds on every thread (its compute probe)

Each result of a row is the same sequence of IEEE operations whatever else is in the call, so the engine is
batch-invariant in every dtype it runs.  The ISA flags are part of the extension's name (an AVX-512 build is
never loaded on a machine without it); the portable C++ path gives the same bits as the vector one (AVX-512, or
AVX2 + FMA + F16C: the same 16 lanes in two registers).
Without a C++ compiler, `kernels()` returns None and the engine falls back to its transformers path.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, TypeVar

import torch

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


def isa() -> str:
    """The instruction set the kernels are built for on this machine (torch's own CPU capability)."""
    cap = str(torch.backends.cpu.get_cpu_capability()).upper()
    if cap.startswith("AVX512"):
        return "avx512"
    return "avx2" if cap.startswith("AVX2") else "portable"


def build_directory() -> Path:
    """Where the compiled extension is cached ($TORCH_EXTENSIONS_DIR, else ~/.cache/forerun/kernels)."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "forerun" / "kernels"
    version = torch.__version__.replace("+", "_").replace(".", "_")
    return base / f"torch_{version}"


def _build() -> Any:
    from torch.utils.cpp_extension import load

    target = isa()
    folder = build_directory() / target
    folder.mkdir(parents=True, exist_ok=True)
    # -falign-loops=64: the linear tiles' loops (~120 bytes) then start on a cache line; unaligned, the 20-row forward
    # measured ~13 % slower on Zen 3 (2026-12-02), from where the loops happened to land.
    flags = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-falign-loops=64", "-fopenmp", *_ISA_FLAGS[target]]
    return load(name=f"forerun_kernels_{target}", sources=[str(_SOURCE)], extra_cflags=flags,
                extra_ldflags=["-fopenmp"], build_directory=str(folder), verbose=False)


def kernels() -> Any | None:
    """The loaded extension module (built on first call, ~1 min; cached afterwards), or None when it cannot be
    built here (the reason is logged once and kept in `unavailable_reason()`).  FORERUN_NATIVE=0 disables it."""
    with _LOCK:
        if "module" in _STATE:
            return _STATE["module"]
        module = None
        if os.environ.get("FORERUN_NATIVE", "1") == "0":
            _STATE["reason"] = "disabled by FORERUN_NATIVE=0"
        else:
            try:
                module = _build()
            except Exception as exc:  # no compiler, no headers, a failed build: the engine falls back
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


def unavailable_reason() -> str | None:
    """Why `kernels()` returned None (None when it loaded or was not tried yet)."""
    return _STATE.get("reason")
