"""The embedded CPU engine: one front door (`EmbeddedEngine`, `EngineConfig`) over its parts.

    module          responsibility
    config          EngineConfig (frozen, validated)
    sampling        pure per-token functions: u(seed, position), log q_τ, inverse-CDF draw, entropy
    scheduler       EmbeddedEngine: submission, the worker loop, prefill / decode / finish
    models          loading a model (default GGUF wheel, tiny in-process Llama, HF folder, .gguf)
    radix_cache     the token-level radix prefix tree of KV segments
"""

from .scheduler import (
    EmbeddedEngine,
    EngineConfig,
    entropy_from_log_probs,
    sample_inverse_cdf,
    sampling_log_probs,
    sampling_uniform,
)

__all__ = [
    "EmbeddedEngine",
    "EngineConfig",
    "entropy_from_log_probs",
    "sample_inverse_cdf",
    "sampling_log_probs",
    "sampling_uniform",
]
