"""Embedded engine settings (frozen, validated at construction)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    """Embedded engine settings."""

    max_total_tokens: int = 32768
    """Token budget of ALL the KV the engine holds: cached prefixes plus the running rows' own KV.  A
    decoding request is admitted only when its row's KV (prompt - 1 + max_new_tokens) fits, after evicting
    unlocked LRU prefixes; otherwise it queues.  A request that could never fit fails at submission."""
    max_batch_size: int = 64
    """Most requests decoded together in one batched forward."""
    batch_window_ms: float = 2.0
    """Gathering window: an idle engine waits this long after the first arrival for more requests."""
    num_threads: int | None = None
    """torch intra-op threads of the engine's worker thread (per-thread setting; the caller's threads are
    untouched).  None: 1 for small models (hidden size < 512: their ops are too small to gain from a
    second thread, which on a busy machine mostly waits for a time slice), else torch's default."""
    request_timeout_s: float | None = None
    """A blocking `generate` raises EngineError after this long (None: wait forever)."""
    batch_invariant: bool | None = None
    """A row's results never depend on what it is batched with, the batch size, the padding, prefill
    chunking or the cache state.  None (default) or True: the native kernels (`kernels.plan_forward`: fast
    and batch-invariant in every dtype, Llama-family models); where they cannot run, True falls back to
    transformers' forward computed row by row (slow; any architecture) and None does so for float64 models
    only (others get SDPA, NOT batch-invariant).  False: transformers' SDPA forward (NOT batch-invariant).
    The engine reports what it runs in `EmbeddedEngine.plan.path` and `server_info()["kernels"]`."""

    def __post_init__(self) -> None:
        if self.max_total_tokens <= 0:
            raise ValueError(f"max_total_tokens must be > 0, got {self.max_total_tokens}")
        if self.max_batch_size <= 0:
            raise ValueError(f"max_batch_size must be > 0, got {self.max_batch_size}")
        if not (self.batch_window_ms >= 0 and math.isfinite(self.batch_window_ms)):
            raise ValueError(f"batch_window_ms must be a finite number >= 0, got {self.batch_window_ms}")
        if self.num_threads is not None and self.num_threads <= 0:
            raise ValueError(f"num_threads must be > 0 or None, got {self.num_threads}")
        if self.request_timeout_s is not None and not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0 or None, got {self.request_timeout_s}")
