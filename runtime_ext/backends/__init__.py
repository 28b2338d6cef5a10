"""Token-exact SGLang frontend backends: programs' text becomes exact token ids, never re-tokenized text.

    module           responsibility
    sglang_frontend  the one place forerun imports the SGLang frontend
    token_markers    token_ids / sampling_seed / logprob_temperatures markers in program text
    token_exact      TokenExactBackend: program text -> ids, remembered generations, select
    embedded         EmbeddedBackend: the frontend backend on the embedded engine
    server_client    SGLangServerClient: the SGLang server as a forerun Engine (HTTP, two-pass log p0),
                     ServerConfig, SGLangServerError
    server           SGLangServerBackend: the frontend backend on the server client
"""
