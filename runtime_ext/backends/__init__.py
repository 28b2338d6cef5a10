"""Token-exact SGLang frontend backends: programs' text becomes exact token ids, never re-tokenized text.

    module           responsibility
    sglang_frontend  the one place forerun imports the SGLang frontend
    token_markers    token_ids / sampling_seed / logprob_temperatures markers in program text
    token_exact      TokenExactBackend: program text -> ids, remembered generations, select
    embedded         EmbeddedBackend: the frontend backend on the embedded engine
    server           the SGLang server: HTTP client (an Engine) and its frontend backend
"""
