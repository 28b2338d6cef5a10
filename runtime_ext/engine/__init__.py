"""The embedded CPU engine: one front door (`EmbeddedEngine`, `EngineConfig`) over its parts.

    module          responsibility
    config          EngineConfig (frozen, validated)
    sampling        pure per-token math: u(seed, position), log p0 / entropy, log q_τ, inverse-CDF draw
    forward         which forward runs (plan_forward: native / rowwise / sdpa); transformers adapters: KV
                    buffers and the buffer cache, the switchable row-by-row linear / attention kernels
    llama_forward   the engine's own Llama-family forward on the native kernels (prefill and decode alike)
    native          building / loading the C++ kernels of csrc/ (batch-invariant linear, attention, norms,
                    vocabulary statistics and draws)
    requests        request bookkeeping: RequestMode, Request, validation (make_request)
    admission       the KV budget: reservations of running rows, FIFO admission, what can never fit
    batch           RunningBatch: decode rows sharing one left-padded KV buffer (prefixes read in place)
    prefill         prefix reuse + prompt KV by mode (generate / logits / pin), SGLang-shifted prompt logprobs
    decode          one decode step's sampling: draw, record and stop check per row
    grammar         constrained decoding: xgrammar compilers (cached per tokenizer and grammar), per-request
                    parse state, the token bitmasks applied to the constrained rows' logits only
    output          stop conditions and the SGLang-shaped GenerateOutput / meta_info
    scheduler       EmbeddedEngine: public API, submission, the worker loop, the decode step
    models          loading a model (default GGUF wheel, tiny in-process Llama, HF folder, .gguf)
    radix_cache     the token-level radix prefix tree of KV segments
    row_streams     per-row progress and abort of streamed requests (streaming PreSTO's rows)
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
