"""Speculative pre-positioning: the ready-distribution cache + gate + invalidation, and the prepositioner.

    module          responsibility
    ready_cache     session state under one lock, the ready distribution, the logit-gap gate (Eq. 11-12)
    engines         the one engine interface (PrepositionEngine) and its adapter for forerun engines
    prepositioner   Algorithm 1 (pre-position in idle time) and Algorithm 2 (gated serve / fall-through)
"""
