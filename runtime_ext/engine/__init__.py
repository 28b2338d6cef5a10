"""The embedded CPU engine: one front door (`EmbeddedEngine`, `EngineConfig`) over its parts.

    module          responsibility
    config          EngineConfig (frozen, validated)
    sampling        pure per-token math: u(seed, position), log p0 / entropy, log q_τ, inverse-CDF draw
    kernels         transformers adapters: KV buffers and the buffer cache, the forward, the switchable
                    batch-invariant linear / attention kernels
    requests        request bookkeeping: RequestMode, Request, validation (make_request)
    batch           RunningBatch: decode rows sharing one left-padded KV buffer
    prefill         prefix reuse + prompt KV by mode (generate / logits / pin), SGLang-shifted prompt logprobs
    decode          one decode step's sampling: draw, record and stop check per row
    output          stop conditions and the SGLang-shaped GenerateOutput / meta_info
    scheduler       EmbeddedEngine: public API, submission, the worker loop, admission, the decode step
    models          loading a model (default GGUF wheel, tiny in-process Llama, HF folder, .gguf)
    radix_cache     the token-level radix prefix tree of KV segments
"""

from .config import EngineConfig
from .sampling import entropy_from_log_probs, sample_inverse_cdf, sampling_log_probs, sampling_uniform
from .scheduler import EmbeddedEngine

__all__ = [
    "EmbeddedEngine",
    "EngineConfig",
    "entropy_from_log_probs",
    "sample_inverse_cdf",
    "sampling_log_probs",
    "sampling_uniform",
]
