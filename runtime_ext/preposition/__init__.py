"""Speculative pre-positioning: the ready-distribution cache + gate + invalidation, and the prepositioner.

    module          responsibility
    gate            the logit-gap gate as pure functions (Eq. 11-12), GateConfig, the gate's explanation
    counters        pre-position and serve counters, hit rate h and wasted fraction w (Eq. 8)
    ready_cache     session state under one lock, its ready distributions (one per pre-positioned entry),
                    eligibility (exact / relaxed / prefix), invalidation, validation before commit
    engines         the one engine interface (PrepositionEngine) and its adapter for forerun engines
    prepositioner   Algorithm 1 (pre-position in idle time) and Algorithm 2 (gated serve / fall-through)
"""
